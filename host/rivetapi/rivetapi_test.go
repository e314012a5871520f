package rivetapi_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/rivetapi"
	"github.com/paddock-dev/paddock/store"
)

// checkShape fails unless body is Rivet's error body: group, code and
// message strings, metadata an object when present, nothing else.
func checkShape(t *testing.T, body map[string]any) {
	t.Helper()
	for k, v := range body {
		switch k {
		case "group", "code", "message":
			if s, ok := v.(string); !ok || s == "" {
				t.Errorf("error %s = %v, want a non-empty string", k, v)
			}
		case "metadata":
			if _, ok := v.(map[string]any); !ok {
				t.Errorf("error metadata = %v, want an object", v)
			}
		default:
			t.Errorf("error body has field %q: %v", k, body)
		}
	}
	for _, k := range []string{"group", "code", "message"} {
		if _, ok := body[k]; !ok {
			t.Errorf("error body lacks %q: %v", k, body)
		}
	}
}

func TestRefusalsAnswerRivetsErrorShapeAndCode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const ok = `"name":"notes","runner_name_selector":"default","crash_policy":"sleep"`
	code, dup := e.do("POST", "/actors?namespace=default", `{"key":"taken",`+ok+`}`)
	if code != 200 {
		t.Fatalf("create: %d %v", code, dup)
	}
	dupID := dup["actor"].(map[string]any)["actor_id"].(string)
	long := strings.Repeat("k", 300)
	tooBig := base64.StdEncoding.EncodeToString(make([]byte, abi.MaxStateBytes+1))
	ids33 := make([]string, 33)
	for i := range ids33 {
		ids33[i] = uuid.NewString()
	}
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		want                     string // group.code
		meta                     map[string]any
		inMessage                string
	}{
		{"no namespace", "POST", "/actors", `{` + ok + `}`, 400, "api.bad_request", nil, "namespace"},
		{"other namespace", "POST", "/actors?namespace=acme", `{` + ok + `}`, 400, "namespace.not_found", nil, "acme"},
		{"other namespace on list", "GET", "/actors?namespace=acme&name=notes", "", 400, "namespace.not_found", nil, "acme"},
		{"other namespace on delete", "DELETE", "/actors/" + dupID + "?namespace=acme", "", 400, "namespace.not_found", nil, "acme"},
		{"unknown field", "POST", "/actors?namespace=default", `{"runner":"x",` + ok + `}`, 400, "api.bad_request", nil, "runner"},
		{"not JSON", "POST", "/actors?namespace=default", `{`, 400, "api.bad_request", nil, ""},
		{"two values", "POST", "/actors?namespace=default", `{` + ok + `} {}`, 400, "api.bad_request", nil, "after top-level value"},
		{"a field twice", "POST", "/actors?namespace=default", `{"name":"nobody",` + ok + `}`, 400, "api.bad_request", nil, "duplicate"},
		{"a field in another case", "POST", "/actors?namespace=default", `{"NAME":"notes","runner_name_selector":"default","crash_policy":"sleep"}`, 400, "api.bad_request", nil, "NAME"},
		{"a cursor it never gave", "GET", "/actors?namespace=default&name=notes&cursor=garbage", "", 400, "api.bad_request", nil, "cursor"},
		{"missing name", "POST", "/actors?namespace=default", `{"runner_name_selector":"default","crash_policy":"sleep"}`, 400, "api.bad_request", nil, "`name`"},
		{"missing runner_name_selector", "POST", "/actors?namespace=default", `{"name":"notes","crash_policy":"sleep"}`, 400, "api.bad_request", nil, "`runner_name_selector`"},
		{"missing crash_policy", "POST", "/actors?namespace=default", `{"name":"notes","runner_name_selector":"default"}`, 400, "api.bad_request", nil, "`crash_policy`"},
		{"bad crash_policy", "POST", "/actors?namespace=default", `{"name":"notes","runner_name_selector":"default","crash_policy":"reboot"}`, 400, "api.bad_request", nil, "reboot"},
		{"get-or-create without key", "PUT", "/actors?namespace=default", `{` + ok + `}`, 400, "api.bad_request", nil, "`key`"},
		{"empty key", "PUT", "/actors?namespace=default", `{"key":"",` + ok + `}`, 400, "actor.empty_key", nil, ""},
		{"key with a space", "POST", "/actors?namespace=default", `{"key":"a b",` + ok + `}`, 400, "validation.invalid_input", nil, "key"},
		{"long key", "PUT", "/actors?namespace=default", `{"key":"` + long + `",` + ok + `}`, 400, "actor.key_too_large",
			map[string]any{"max_size": float64(200), "key_preview": long[:200]}, ""},
		{"input not base64", "POST", "/actors?namespace=default", `{"input":"%%%",` + ok + `}`, 400, "validation.invalid_input", nil, "base64"},
		{"input too large", "POST", "/actors?namespace=default", `{"input":"` + tooBig + `",` + ok + `}`, 400, "actor.input_too_large",
			map[string]any{"max_size": float64(abi.MaxStateBytes)}, ""},
		{"unknown agent", "POST", "/actors?namespace=default", `{"name":"nobody","runner_name_selector":"default","crash_policy":"sleep"}`, 400, "validation.invalid_input", nil, "nobody"},
		{"unknown pool", "POST", "/actors?namespace=default", `{"name":"notes","runner_name_selector":"gpu","crash_policy":"sleep"}`, 400, "actor.no_runner_config_configured",
			map[string]any{"namespace": "default", "pool_name": "gpu"}, "gpu"},
		{"another agent's pool", "POST", "/actors?namespace=default", `{"name":"notes","runner_name_selector":"batch","crash_policy":"sleep"}`, 400, "validation.invalid_input", nil, `runs in pool "default"`},
		{"unknown datacenter", "POST", "/actors?namespace=default", `{"datacenter":"eu",` + ok + `}`, 400, "datacenter.not_found", nil, ""},
		{"duplicate key", "POST", "/actors?namespace=default", `{"key":"taken",` + ok + `}`, 400, "actor.duplicate_key",
			map[string]any{"key": "taken", "existing_actor_id": dupID}, dupID},
		{"ids and name", "GET", "/actors?namespace=default&actor_ids=" + dupID + "&name=notes", "", 400, "validation.invalid_input", nil, "Cannot provide both"},
		{"key without name", "GET", "/actors?namespace=default&key=taken", "", 400, "validation.invalid_input", nil, "Name is required when key"},
		{"neither ids nor name", "GET", "/actors?namespace=default", "", 400, "validation.invalid_input", nil, "Name is required"},
		{"33 ids", "GET", "/actors?namespace=default&actor_ids=" + strings.Join(ids33, ","), "", 400, "validation.too_many_actor_ids",
			map[string]any{"max": float64(32), "count": float64(33)}, ""},
		{"empty id", "GET", "/actors?namespace=default&actor_ids=" + dupID + ",", "", 400, "api.bad_request", nil, "actor_ids"},
		{"bad include_destroyed", "GET", "/actors?namespace=default&name=notes&include_destroyed=maybe", "", 400, "api.bad_request", nil, "include_destroyed"},
		{"negative limit", "GET", "/actors?namespace=default&name=notes&limit=-1", "", 400, "api.bad_request", nil, "limit"},
		{"delete unknown actor", "DELETE", "/actors/" + uuid.NewString() + "?namespace=default", "", 400, "actor.not_found", nil, ""},
		{"method", "PATCH", "/actors?namespace=default", "", 405, "api.method_not_allowed", nil, ""},
		{"method on an actor", "GET", "/actors/" + dupID, "", 405, "api.method_not_allowed", nil, ""},
		{"names are not served", "GET", "/actors/names?namespace=default", "", 404, "api.not_found", nil, "/actors/names"},
		{"no such route", "GET", "/actors/" + dupID + "/kv/keys/x?namespace=default", "", 404, "api.not_found", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := e.do(c.method, c.path, c.body)
			if got := fmt.Sprint(body["group"], ".", body["code"]); code != c.status || got != c.want {
				t.Fatalf("%d %s, want %d %s: %v", code, got, c.status, c.want, body)
			}
			checkShape(t, body)
			if c.meta != nil {
				if got := fmt.Sprint(body["metadata"]); got != fmt.Sprint(c.meta) {
					t.Errorf("metadata %s, want %s", got, fmt.Sprint(c.meta))
				}
			}
			if msg, _ := body["message"].(string); !strings.Contains(msg, c.inMessage) {
				t.Errorf("message %q does not name %q", msg, c.inMessage)
			}
		})
	}
}

func TestEveryRouteNeedsTheToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, r := range rivetapi.Routes() {
		method, path, _ := strings.Cut(r, " ")
		path = strings.Replace(path, "{actor_id}", uuid.NewString(), 1) + "?namespace=default&name=notes"
		for _, auth := range []string{"", "Bearer wrong", "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+token))} {
			req, _ := http.NewRequest(method, e.url+path, strings.NewReader(`{"name":"notes","runner_name_selector":"default","crash_policy":"sleep"}`))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 401 {
				t.Errorf("%s with %q: %d, want 401", r, auth, resp.StatusCode)
			}
		}
	}
	// Nothing was created by the refused requests.
	if code, body := e.do("GET", "/actors?namespace=default&name=notes&include_destroyed=true", ""); code != 200 || len(body["actors"].([]any)) != 0 {
		t.Fatalf("after refused requests: %d %v", code, body)
	}
	if code, body := e.do("GET", "/actors?namespace=default&name=notes", ""); code != 200 {
		t.Fatalf("with the token: %d %v", code, body)
	}
}

func TestActorObjectHasRivetsFieldsInMilliseconds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code, body := e.do("POST", "/actors?namespace=default", `{"name":"notes","runner_name_selector":"default","crash_policy":"destroy","input":"aGk="}`)
	if code != 200 {
		t.Fatalf("create: %d %v", code, body)
	}
	a := body["actor"].(map[string]any)
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"actor_id", "connectable_ts", "crash_policy", "create_ts", "datacenter", "destroy_ts", "key", "name", "namespace_id",
		"pending_allocation_ts", "reschedule_ts", "runner_name_selector", "sleep_ts", "start_ts"}
	if !slices.Equal(keys, want) {
		t.Fatalf("actor fields %v, want %v", keys, want)
	}
	id := a["actor_id"].(string)
	x, err := e.svc.GetSession(t.Context(), mustAgent(t, e, "notes"), id)
	if err != nil {
		t.Fatal(err)
	}
	if a["create_ts"] != float64(x.CreatedAt.UnixMilli()) || a["start_ts"] != a["create_ts"] || a["connectable_ts"] != a["create_ts"] {
		t.Errorf("times %v %v %v, want create_ts %d ms", a["create_ts"], a["start_ts"], a["connectable_ts"], x.CreatedAt.UnixMilli())
	}
	for _, k := range []string{"key", "destroy_ts", "sleep_ts", "pending_allocation_ts", "reschedule_ts"} {
		if a[k] != nil {
			t.Errorf("%s = %v, want null", k, a[k])
		}
	}
	if a["name"] != "notes" || a["namespace_id"] != "default" || a["runner_name_selector"] != "default" || a["crash_policy"] != "destroy" {
		t.Errorf("actor %v", a)
	}
	if string(x.Input) != "hi" {
		t.Errorf("session input %q, want the decoded base64 \"hi\"", x.Input)
	}
	if code, body := e.do("DELETE", "/actors/"+id, ""); code != 200 || len(body) != 0 {
		t.Fatalf("delete without namespace: %d %v", code, body)
	}
	_, body = e.do("GET", "/actors?namespace=default&actor_id="+id, "")
	d := body["actors"].([]any)[0].(map[string]any)
	x, _ = e.svc.GetSession(t.Context(), mustAgent(t, e, "notes"), id)
	if x.DestroyTS == nil || d["destroy_ts"] != float64(x.DestroyTS.UnixMilli()) || d["connectable_ts"] != nil {
		t.Errorf("destroyed actor %v, session destroy_ts %v", d, x.DestroyTS)
	}
}

func TestPaddocksAPIStillServedBesideActors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if code, body := e.do("GET", "/v1/agents/notes", ""); code != 200 || body["name"] != "notes" {
		t.Fatalf("/v1 through Mount: %d %v", code, body)
	}
}

func mustAgent(t *testing.T, e *env, name string) store.Agent {
	t.Helper()
	a, err := e.svc.GetAgent(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAnEmptyKeyListsNoActor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code, body := e.do("POST", "/actors?namespace=default", `{"key":"k1","name":"notes","runner_name_selector":"default","crash_policy":"sleep"}`)
	if code != 200 {
		t.Fatalf("create: %d %v", code, body)
	}
	code, body = e.do("GET", "/actors?namespace=default&name=notes", "")
	if n := len(body["actors"].([]any)); code != 200 || n != 1 {
		t.Fatalf("list by name: %d, %d actors, want 200 and 1: %v", code, n, body)
	}
	// `key=` is a key no actor can have, not "any key".
	code, body = e.do("GET", "/actors?namespace=default&name=notes&key=", "")
	if n := len(body["actors"].([]any)); code != 200 || n != 0 {
		t.Fatalf("list with key= : %d, %d actors, want 200 and none: %v", code, n, body)
	}
}
