package server

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// guard runs before any handler. Order matters: the Host and Origin checks
// come first, so a browser page cannot use the API at all.
//
//   - DNS rebinding: a page on evil.example whose name re-resolves to
//     127.0.0.1 reaches this port, but its requests carry
//     "Host: evil.example"; only local names (and configured ones) pass.
//   - CSRF: a browser adds Origin (and Referer) to cross-site requests; no
//     legitimate client of this API is a browser, so any Origin or Referer
//     is refused.
//   - Token: with worker_token set, every call except the probes must carry
//     it; compared in constant time so timing does not leak it.
func (s *Server) guard(next http.Handler) http.Handler {
	allowed := map[string]bool{"localhost": true, "127.0.0.1": true, "::1": true}
	allowed[strings.ToLower(strings.Trim(s.cfg.WorkerHost, "[]"))] = true
	for _, h := range s.cfg.AllowedHosts {
		allowed[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	token := []byte(s.cfg.WorkerToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.ToLower(strings.Trim(host, "[]"))
		// Over the unix socket any Host passes: no browser can connect to
		// a unix socket, so DNS rebinding cannot reach it, and its clients
		// send what they like there ("localhost", the encoded path, none).
		if !allowed[host] && !viaUnixSocket(r) {
			s.reject(w, "forbidden", http.StatusForbidden, "Host "+quote(r.Host)+" is not allowed (DNS-rebinding defence)")
			return
		}
		if r.Header.Get("Origin") != "" || r.Header.Get("Referer") != "" {
			s.reject(w, "forbidden", http.StatusForbidden, "requests with an Origin or Referer header are refused (CSRF defence): this API is not for browsers")
			return
		}
		if len(token) > 0 && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), token) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
				s.reject(w, "unauthorized", http.StatusUnauthorized, "missing or wrong bearer token")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func quote(s string) string { return `"` + clip(s) + `"` }
