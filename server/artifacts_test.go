package server

import "testing"

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
