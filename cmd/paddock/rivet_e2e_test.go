package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestServeMountsRivetsActorsAPI: paddock serve answers Rivet's actors API
// at /actors next to /v1, over the same sessions.
func TestServeMountsRivetsActorsAPI(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	s := startServer(t, writeConfig(t, "sqlite", addr), addr)
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("%s %s: %d, not JSON: %v", method, path, resp.StatusCode, err)
		}
		return resp.StatusCode, out
	}
	code, body := do("PUT", "/actors?namespace=default", `{"name":"notes","key":"user-1","runner_name_selector":"default","crash_policy":"sleep"}`)
	if code != 200 || body["created"] != true {
		t.Fatalf("PUT /actors: %d %v", code, body)
	}
	id := body["actor"].(map[string]any)["actor_id"].(string)
	if x := s.session("notes", id); x.Key != "user-1" || string(x.CrashPolicy) != "sleep" {
		t.Fatalf("the actor is not the session: %+v", x)
	}
	if code, body := do("DELETE", "/actors/"+id+"?namespace=default", ""); code != 200 || len(body) != 0 {
		t.Fatalf("DELETE /actors: %d %v", code, body)
	}
	if x := s.session("notes", id); x.DestroyTS == nil {
		t.Fatalf("session not destroyed: %+v", x)
	}
	if code, body := do("GET", "/actors/nope/kv", ""); code != 404 || body["group"] != "api" {
		t.Fatalf("unknown /actors route: %d %v", code, body)
	}
}
