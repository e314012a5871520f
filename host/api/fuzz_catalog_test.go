package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// FuzzAgent fuzzes the body of agent registration (POST /v1/agents) and
// re-binding (PUT /v1/agents/fz). An accepted agent reads back with the
// binding and crash policy sent.
func FuzzAgent(f *testing.F) {
	for _, s := range []string{
		`{"name":"a1","module":"` + fzModule + `"}`, `{"name":"a2","plugin":"p1","crash_policy":"destroy"}`,
		`{"name":"fz","module":"` + fzModule + `"}`, `{"name":"a3","module":"sha256:00"}`, `{"name":"a4","plugin":"nope"}`,
		`{"name":"A5","module":"` + fzModule + `"}`, `{"name":"a6","module":"x","plugin":"p1"}`, `{"name":"a7"}`,
		`{"module":"` + fzModule + `","crash_policy":"sleep"}`, `{"plugin":"p1"}`, `{"name":"` + strings.Repeat("n", 64) + `","module":"` + fzModule + `"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte, update bool) {
		method, path := "POST", "/v1/agents"
		if update {
			method, path = "PUT", "/v1/agents/fz"
		}
		code, out := e.do(t, method, path, body)
		if code != http.StatusOK && code != http.StatusCreated {
			return
		}
		in := decodeLoose(body)
		name, _ := out["name"].(string)
		if !update && name != str(in, "name") {
			t.Fatalf("registered %q, sent %q", name, str(in, "name"))
		}
		a, err := e.st.GetAgent(context.Background(), store.DefaultNamespace, name)
		if err != nil {
			t.Fatalf("accepted agent %q does not read back: %v", name, err)
		}
		if a.ModuleDigest != str(in, "module") || a.Plugin != str(in, "plugin") {
			t.Fatalf("stored binding module %q plugin %q, sent %q %q", a.ModuleDigest, a.Plugin, str(in, "module"), str(in, "plugin"))
		}
		if p := str(in, "crash_policy"); p != "" && a.CrashPolicy != store.CrashPolicy(p) {
			t.Fatalf("stored crash policy %q, sent %q", a.CrashPolicy, p)
		}
		if !a.CrashPolicy.Valid() {
			t.Fatalf("stored crash policy %q is not valid", a.CrashPolicy)
		}
	})
}

// FuzzPlugin fuzzes the body of plugin registration (POST /v1/plugins). An
// accepted plugin reads back with the path, checksum, environment and
// process count sent.
func FuzzPlugin(f *testing.F) {
	sum := strings.Repeat("0", 64)
	for _, s := range []string{
		`{"name":"p2","path":"/bin/true","sha256":"` + sum + `"}`,
		`{"name":"p3","path":"/bin/true","sha256":"` + sum + `","env":{"API_KEY":"x","EMPTY":""},"processes":4}`,
		`{"name":"p4","path":"relative","sha256":"` + sum + `"}`, `{"name":"p5","path":"/x","sha256":"ABC"}`,
		`{"name":"p6","path":"/x","sha256":"` + sum + `","processes":65}`, `{"name":"p7","path":"/x","sha256":"` + sum + `","env":{"A":1}}`,
		`{"name":"p8","path":"/x","sha256":"` + sum + `","env":{"A=B":"c","":"d","N":"nul\u0000"}}`,
	} {
		f.Add([]byte(s))
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		code, out := e.do(t, "POST", "/v1/plugins", body)
		if code != http.StatusOK && code != http.StatusCreated {
			return
		}
		in := decodeLoose(body)
		name, _ := out["name"].(string)
		p, err := e.st.GetPluginWorker(context.Background(), store.DefaultNamespace, name)
		if err != nil {
			t.Fatalf("accepted plugin %q does not read back: %v", name, err)
		}
		var env map[string]string
		_ = json.Unmarshal(in["env"], &env)
		if len(env) == 0 {
			env = nil
		}
		if len(p.Env) == 0 {
			p.Env = nil
		}
		procs := 1
		_ = json.Unmarshal(in["processes"], &procs)
		if procs == 0 {
			procs = 1
		}
		if p.Path != str(in, "path") || p.SHA256 != str(in, "sha256") || !reflect.DeepEqual(p.Env, env) || p.Processes != procs {
			t.Fatalf("stored %+v, sent %s", p, body)
		}
		for k, v := range p.Env {
			if !envName(k) || abi.ValidText(v) != nil {
				t.Fatalf("accepted environment entry %q=%q, which no process can be given", k, v)
			}
		}
	})
}

// envName reports whether k can name an environment variable: no "=",
// no NUL (and, as the API asks, a portable name).
func envName(k string) bool {
	return k != "" && !strings.ContainsAny(k, "=\x00")
}

// FuzzQuery fuzzes the path and query parameters of the read routes
// (events, an event, sessions, dead letters, transcript, alarms): every
// answer is a 2xx or a 4xx naming the parameter.
func FuzzQuery(f *testing.F) {
	for _, s := range []struct {
		route      uint8
		seg, query string
	}{
		{0, "", "status=open&limit=5&after=0"}, {0, "", "status=bogus"}, {0, "", "limit=0"}, {0, "", "after=-1"},
		{1, "1", ""}, {1, "0", ""}, {1, "x", ""}, {1, "99999999999999999999", ""}, {2, "", "limit=500&cursor=s1"},
		{3, "", "limit=1001"}, {4, "", "after=1&limit=1"}, {5, "", ""}, {6, "1", ""}, {7, "", "session=s1&after=9223372036854775807"},
		{8, "s1", ""}, {8, "nope", ""}, {1, "%zz", ""},
	} {
		f.Add(s.route, s.seg, s.query)
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, route uint8, seg, query string) {
		base := "/v1/agents/fz/sessions/s1"
		var method, target string
		switch route % 9 {
		case 0:
			method, target = "GET", base+"/events"
		case 1:
			method, target = "GET", base+"/events/"+url.PathEscape(seg)
		case 2:
			method, target = "GET", "/v1/agents/fz/sessions"
		case 3:
			method, target = "GET", base+"/dead-letters"
		case 4:
			method, target = "GET", base+"/transcript"
		case 5:
			method, target = "GET", base+"/alarms"
		case 6:
			method, target = "POST", base+"/events/"+url.PathEscape(seg)+"/cancel"
		case 7:
			method, target = "GET", "/v1/agents/fz/dead-letters"
		case 8:
			method, target = "GET", "/v1/agents/fz/sessions/"+url.PathEscape(seg)
		}
		q, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		q.Del("wait") // a long poll would only make the fuzzer wait
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		code, out := e.do(t, method, target, nil)
		if code == http.StatusBadRequest {
			eo := out["error"].(map[string]any)
			field, _ := eo["field"].(string)
			if field == "" || (!q.Has(field) && field != "event") {
				t.Fatalf("%s %s: 400 naming field %q, not one of the parameters", method, target, field)
			}
		}
	})
}
