package server

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"testing"
)

// The same through a real sandbox and the API.
func TestArtifactNamesNotUTF8ThroughAPI(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{Code: `cd /workspace/output/artifacts
echo one > "$(printf 'x\377.csv')"; echo two > "$(printf 'x\376.csv')"; echo ok > ok.csv`})
	wantExecStatus(t, resp, "succeeded")
	if len(resp.Artifacts) != 1 || resp.Artifacts[0].Name != "ok.csv" {
		t.Errorf("artifacts = %+v, want only ok.csv", resp.Artifacts)
	}
	got := map[string]string{}
	for _, o := range resp.ArtifactsOmitted {
		got[o.Name] = o.Reason
	}
	if want := map[string]string{`x\xfe.csv`: "name_not_utf8", `x\xff.csv`: "name_not_utf8"}; len(got) != 2 ||
		got[`x\xfe.csv`] != want[`x\xfe.csv`] || got[`x\xff.csv`] != want[`x\xff.csv`] {
		t.Errorf("omitted = %v, want %v", got, want)
	}
}

// GET /v1/executions/{id}/artifacts/{name} through a real sandbox: each
// artifact's own bytes, in a subdirectory too, equal to the answer's
// base64 (SECURITY.md case 55).
func TestArtifactRoute(t *testing.T) {
	e := newEnv(t, shellRootfs(t), nil)
	resp := e.execute(ExecutionRequest{ID: "arts-real", Code: `cd /workspace/output/artifacts
mkdir -p sub; printf 'a,b\n1,2\n' > 'sub/t x.csv'; head -c 300000 /dev/zero | tr '\0' 'z' > big.txt; printf hi > small.txt`})
	wantExecStatus(t, resp, "succeeded")
	if len(resp.Artifacts) != 3 {
		t.Fatalf("artifacts = %+v", resp.Artifacts)
	}
	for _, a := range resp.Artifacts {
		code, h, body := e.do("GET", artifactPath("arts-real", a.Name), nil)
		want, _ := base64.StdEncoding.DecodeString(a.ContentBase64)
		if code != http.StatusOK || !bytes.Equal(body, want) || h.Get("Content-Type") != a.MediaType {
			t.Errorf("GET %s = %d, %d bytes, %s; want %d bytes, %s", a.Name, code, len(body), h.Get("Content-Type"), len(want), a.MediaType)
		}
	}
	code, _, body := e.do("GET", artifactPath("arts-real", "nope.txt"), nil)
	wantError(t, code, body, http.StatusNotFound, "no artifact")
}
