package api_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestACallWithOddBytesInItsPathIsAudited: a mutating call whose path
// holds bytes a text column refuses (an invalid UTF-8 byte, a NUL, as
// percent escapes) still gets its audit row (docs/DESIGN.md "Tokens, roles
// and the audit log": every call is recorded), with those bytes replaced,
// on both drivers — a prober cannot leave no trace.
func TestACallWithOddBytesInItsPathIsAudited(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newAuthEnv(t, driver)
		for _, odd := range []string{"%FF", "%00", "x%C3"} {
			path := "/v1/agents/notes/sessions/" + odd + "/signals"
			if code, raw, _ := e.raw("POST", path, e.tokens["client"], []byte(`{"message":"x"}`)); code < 400 {
				t.Fatalf("signal to session %s: %d %s", odd, code, raw)
			}
			code, raw, _ := e.raw("GET", "/v1/audit?limit=1", e.tokens["admin"], nil)
			var m struct {
				Entries []struct {
					TokenID string `json:"token_id"`
					Object  string `json:"object"`
				} `json:"entries"`
			}
			if err := json.Unmarshal(raw, &m); code != 200 || err != nil {
				t.Fatalf("audit: %d %s", code, raw)
			}
			if len(m.Entries) != 1 || m.Entries[0].TokenID != e.ids["client"] ||
				!strings.HasPrefix(m.Entries[0].Object, "/v1/agents/notes/sessions/") || !strings.HasSuffix(m.Entries[0].Object, "/signals") {
				t.Fatalf("signal to session %s: the newest audit row is %+v, want the client's call", odd, m.Entries)
			}
			if o := m.Entries[0].Object; strings.ContainsRune(o, 0) {
				t.Errorf("signal to session %s: audit object %q holds a NUL", odd, o)
			}
		}
	})
}
