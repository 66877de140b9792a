// Command pki writes the certificates, keys and kubeconfigs of the test
// cluster of `make test-k8s` (cluster.sh): one CA, the API server's serving
// certificate, a client certificate per component and per node, and the
// service account key pair. Go's crypto instead of openssl: nothing to
// install, and every name and usage is written here, once.
//
//	go run ./tools/deploy/kubernetes/cluster/pki -out DIR -server https://ADDR:6443 -sans IP,... -nodes n1,n2,n3
//
// For a throw-away cluster on one machine: the keys live as long as the
// cluster (cluster.sh down removes them), ECDSA P-256, valid for a day.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	out := flag.String("out", "", "directory to write into (created)")
	server := flag.String("server", "", "the API server's URL, for the kubeconfigs")
	sans := flag.String("sans", "", "comma-separated IPs and names of the API server's certificate")
	nodes := flag.String("nodes", "", "comma-separated node names")
	flag.Parse()
	if *out == "" || *server == "" || *sans == "" || *nodes == "" {
		fmt.Fprintln(os.Stderr, "usage: pki -out DIR -server URL -sans IP,NAME,... -nodes n1,n2,...")
		os.Exit(2)
	}
	if err := run(*out, *server, strings.Split(*sans, ","), strings.Split(*nodes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "pki:", err)
		os.Exit(1)
	}
}

type pair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // the certificate
}

func run(out, server string, sans, nodes []string) error {
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour) // tolerate a little clock skew
	ca, err := issue(nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "sandboxd-test-cluster-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, NotBefore: now, NotAfter: now.Add(25 * time.Hour),
	})
	if err != nil {
		return err
	}
	if err := save(out, "ca", ca); err != nil {
		return err
	}
	serving := &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			serving.IPAddresses = append(serving.IPAddresses, ip)
		} else {
			serving.DNSNames = append(serving.DNSNames, s)
		}
	}
	apiserver, err := issue(ca, serving)
	if err != nil {
		return err
	}
	if err := save(out, "apiserver", apiserver); err != nil {
		return err
	}
	// The clients: the user name is the CN, the groups the O (the
	// apiserver's x509 authenticator); the bootstrap RBAC policy knows
	// the component users by these names.
	clients := map[string]pkix.Name{
		"admin":                    {CommonName: "sandboxd-test-admin", Organization: []string{"system:masters"}},
		"apiserver-kubelet-client": {CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		"controller-manager":       {CommonName: "system:kube-controller-manager"},
		"scheduler":                {CommonName: "system:kube-scheduler"},
		"kube-proxy":               {CommonName: "system:kube-proxy"},
	}
	for _, n := range nodes {
		clients["kubelet-"+n] = pkix.Name{CommonName: "system:node:" + n, Organization: []string{"system:nodes"}}
	}
	for name, subject := range clients {
		p, err := issue(ca, &x509.Certificate{Subject: subject, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err != nil {
			return err
		}
		if err := save(out, name, p); err != nil {
			return err
		}
		if name == "apiserver-kubelet-client" {
			continue
		}
		if err := kubeconfig(out, name, server, ca, p); err != nil {
			return err
		}
	}
	// The service account tokens' signing key.
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return writeKey(filepath.Join(out, "sa.key"), sa)
}

// issue makes a key and a certificate for tmpl, signed by ca (self-signed
// when ca is nil).
func issue(ca *pair, tmpl *x509.Certificate) (*pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = ca.cert.NotBefore, ca.cert.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	}
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &pair{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func save(dir, name string, p *pair) error {
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), p.pem, 0o600); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), p.key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// kubeconfig writes NAME.kubeconfig: server, the CA and the client's
// certificate and key, embedded.
func kubeconfig(dir, name, server string, ca, p *pair) error {
	der, err := x509.MarshalECPrivateKey(p.key)
	if err != nil {
		return err
	}
	b64 := base64.StdEncoding.EncodeToString
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: sandboxd-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: sandboxd-test
  context: {cluster: sandboxd-test, user: %s}
current-context: sandboxd-test
`, server, b64(ca.pem), name, b64(p.pem), b64(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})), name)
	return os.WriteFile(filepath.Join(dir, name+".kubeconfig"), []byte(text), 0o600)
}
