package server

import (
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/server/config"
)

// config.ReservedEnv, which allowed_env may not name, must cover every
// variable the worker sets; LANG alone is a default a request may change.
func TestBaseEnvIsReserved(t *testing.T) {
	for _, pol := range PoliciesFromConfig(config.Default()) {
		for _, kv := range pol.BaseEnv() {
			name, _, _ := strings.Cut(kv, "=")
			if name != "LANG" && !config.ReservedEnv[name] {
				t.Errorf("policy %s sets %s, which config.ReservedEnv lacks", pol.Name, name)
			}
		}
	}
}
