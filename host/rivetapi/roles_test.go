package rivetapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/service"
)

// TestRolesOnTheActorsAPI: Rivet's routes take the same stored tokens and
// rules as /v1: a reader lists but may not create (403 api.forbidden,
// nothing written), a client creates but may not destroy, an operator
// destroys; each write is audited with its token id.
func TestRolesOnTheActorsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := service.WithCaller(context.Background(), service.Caller{TokenID: service.BootstrapTokenID, Role: service.RoleAdmin})
	tok := map[string]service.NewToken{}
	for _, role := range []string{"reader", "client", "operator"} {
		nt, err := e.svc.CreateToken(admin, service.CreateTokenParams{Role: role})
		if err != nil {
			t.Fatal(err)
		}
		tok[role] = nt
	}
	call := func(role, method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok[role].Value)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return resp.StatusCode, m
	}
	const create = `{"name":"notes","runner_name_selector":"default","crash_policy":"sleep"}`
	if code, m := call("reader", "POST", "/actors?namespace=default", create); code != 403 || m["code"] != "forbidden" || m["group"] != "api" {
		t.Fatalf("reader create: %d %v", code, m)
	}
	if code, m := call("reader", "GET", "/actors?namespace=default&name=notes", ""); code != 200 || len(m["actors"].([]any)) != 0 {
		t.Fatalf("reader list after the refused create: %d %v", code, m)
	}
	code, m := call("client", "POST", "/actors?namespace=default", create)
	if code != 200 {
		t.Fatalf("client create: %d %v", code, m)
	}
	id := m["actor"].(map[string]any)["actor_id"].(string)
	if code, m := call("client", "DELETE", "/actors/"+id+"?namespace=default", ""); code != 403 {
		t.Fatalf("client destroy: %d %v", code, m)
	}
	if code, m := call("operator", "DELETE", "/actors/"+id+"?namespace=default", ""); code != 200 {
		t.Fatalf("operator destroy: %d %v", code, m)
	}
	rows, _, err := e.svc.ListAudit(admin, service.AuditPage{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].TokenID != tok["operator"].ID || rows[0].Action != "session.destroy" || rows[0].Result != "ok" ||
		rows[1].TokenID != tok["client"].ID || rows[1].Action != "session.create" {
		t.Fatalf("audit: %+v", rows)
	}
}
