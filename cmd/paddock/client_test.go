package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEventsLabelsTheLastErrorOfADoneEvent runs `paddock events` against a
// server answering a fixed event list: a done event's last error (from an
// earlier, failed attempt) is labelled as such, an open event's is shown
// as it is, and --output json prints the server's body unchanged.
func TestEventsLabelsTheLastErrorOfADoneEvent(t *testing.T) {
	const body = `{"events":[` +
		`{"event_id":1,"seq":1,"kind":"message","payload":{"message":"a"},"status":"done","attempts":1,"last_error":"no_worker: no worker of pool p"},` +
		`{"event_id":2,"seq":2,"kind":"message","payload":{"message":"b"},"status":"open","attempts":2,"last_error":"trap: unreachable"},` +
		`{"event_id":3,"seq":3,"kind":"message","payload":{"message":"c"},"status":"done","attempts":0}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/agents/ag/sessions/s1/events" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	run := func(args ...string) string {
		t.Helper()
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--server", srv.URL}, args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}

	lines := strings.Split(strings.TrimSpace(run("events", "ag", "s1")), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 rows, got:\n%s", strings.Join(lines, "\n"))
	}
	for i, want := range []struct{ has, hasNot string }{
		{"(earlier attempt) no_worker: no worker of pool p", ""},
		{"trap: unreachable", "(earlier attempt)"},
		{"done", "(earlier attempt)"},
	} {
		row := lines[i+1]
		if !strings.Contains(row, want.has) || (want.hasNot != "" && strings.Contains(row, want.hasNot)) {
			t.Errorf("row %d %q: want %q and not %q", i+1, row, want.has, want.hasNot)
		}
	}

	var got, sent any
	if err := json.Unmarshal([]byte(run("events", "ag", "s1", "--output", "json")), &got); err != nil {
		t.Fatalf("--output json is not JSON: %v", err)
	}
	_ = json.Unmarshal([]byte(body), &sent)
	g, _ := json.Marshal(got)
	s, _ := json.Marshal(sent)
	if !bytes.Equal(g, s) {
		t.Errorf("--output json changed the body:\n got %s\nwant %s", g, s)
	}
}
