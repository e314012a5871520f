package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// hostile is agent- or user-written text that would drive a terminal
// printed raw: an OSC setting the window title, BEL, CSI clearing the
// screen, a C1 CSI, a carriage return and a bidi override.
const hostile = "\x1b]0;pwned\x07\x1b[2J\u009b31m\rX\u202e"

// hasControls reports the first terminal control in human output s (tab
// and newline allowed).
func hasControls(s string) (rune, bool) {
	for _, r := range s {
		if escapeRune(r) || r == '\r' {
			return r, true
		}
	}
	return 0, false
}

// TestTranscriptEscapesControlsAndForgedHeaders sends, through the real
// API, a message with terminal controls and a multi-line message whose
// second line is a forged turn header: `paddock transcript` shows both
// inert (escaped controls, an indented continuation line), and --output
// json prints them exactly.
func TestTranscriptEscapesControlsAndForgedHeaders(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20)
	_, wasmBytes := wasmtest.BuildExample(t, wasmtest.Notes)
	m, err := ra.api.UploadModule(ctx, wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ra.api.CreateAgent(ctx, apiclient.CreateAgentRequest{Name: "notes", Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	s, err := ra.api.CreateSession(ctx, "notes", apiclient.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	forged := fmt.Sprintf("ok\n── turn 99 (event 99, epoch 1, done) %s", time.Now().Format(time.TimeOnly))
	for _, msg := range []string{hostile, forged} {
		out, err := ra.run(ctx, "signal", "send", "notes", s.SessionID, msg, "--wait")
		if err != nil {
			t.Fatalf("signal send --wait: %v\n%s", err, out)
		}
		if r, ok := hasControls(out); ok {
			t.Errorf("signal send --wait printed control %U raw: %q", r, out)
		}
	}

	out, err := ra.run(ctx, "transcript", "notes", s.SessionID)
	if err != nil {
		t.Fatalf("transcript: %v\n%s", err, out)
	}
	if r, ok := hasControls(out); ok {
		t.Errorf("transcript printed control %U raw:\n%q", r, out)
	}
	if want := `user: \x1b]0;pwned\x07\x1b[2J\u009b31m\rX\u202e`; !strings.Contains(out, want+"\n") {
		t.Errorf("transcript does not show the controls escaped (%s):\n%s", want, out)
	}
	headers := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "── turn") {
			headers++
			if strings.HasPrefix(line, "── turn 99") {
				t.Errorf("a message forged a turn header: %q", line)
			}
		}
	}
	if headers != 2 {
		t.Errorf("want 2 turn headers, got %d:\n%s", headers, out)
	}
	if !strings.Contains(out, "user: ok\n"+contIndent+"── turn 99") {
		t.Errorf("the continuation line is not indented:\n%s", out)
	}

	js, err := ra.run(ctx, "transcript", "notes", s.SessionID, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var contents []string
	dec := json.NewDecoder(strings.NewReader(js))
	for dec.More() {
		var turn printedTurn
		if err := dec.Decode(&turn); err != nil {
			t.Fatalf("transcript --output json: %v\n%s", err, js)
		}
		contents = append(contents, turn.Messages[0].Content)
	}
	if len(contents) != 2 || contents[0] != hostile || contents[1] != forged {
		t.Errorf("--output json changed the messages: %q", contents)
	}
}

// TestErrorsAndPayloadsEscapeControls runs `paddock events`, `event show`
// and `dead-letters` against a server answering error texts and payloads
// with terminal controls (an agent's error or message can carry any
// text): the human output escapes them and keeps a multi-line error's
// lines indented; --output json prints the body unchanged.
func TestErrorsAndPayloadsEscapeControls(t *testing.T) {
	lastErr, _ := json.Marshal(hostile + "\nline2\n── turn 99")
	payload := `{"message":"\u009b2J` + "\u202e" + `"}`
	event := fmt.Sprintf(`{"event_id":1,"seq":1,"kind":"message","payload":%s,"status":"dead_letter","attempts":1,"last_error":%s,`+
		`"errors":[{"attempt":1,"actor_epoch":1,"counted":true,"error":%s}]}`, payload, lastErr, lastErr)
	bodies := map[string]string{
		"/v1/agents/ag/sessions/s1/events":       `{"events":[` + event + `]}`,
		"/v1/agents/ag/sessions/s1/events/1":     event,
		"/v1/agents/ag/sessions/s1/dead-letters": `{"dead_letters":[{"session_id":"s1","event":` + event + `}]}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(b))
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
	for _, c := range []struct {
		args []string
		path string
	}{
		{[]string{"events", "ag", "s1"}, "/v1/agents/ag/sessions/s1/events"},
		{[]string{"event", "show", "ag", "s1", "1"}, "/v1/agents/ag/sessions/s1/events/1"},
		{[]string{"dead-letters", "ag", "s1"}, "/v1/agents/ag/sessions/s1/dead-letters"},
	} {
		args := c.args
		out := run(args...)
		if r, ok := hasControls(out); ok {
			t.Errorf("paddock %s printed control %U raw:\n%q", strings.Join(args, " "), r, out)
		}
		if !strings.Contains(out, `\x1b]0;pwned\x07\x1b[2J`) {
			t.Errorf("paddock %s does not show the error escaped:\n%s", strings.Join(args, " "), out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "── turn") {
				t.Errorf("paddock %s: an error forged a line: %q", strings.Join(args, " "), line)
			}
		}
		js := run(append(args, "--output", "json")...)
		var got, sent any
		if err := json.Unmarshal([]byte(js), &got); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal([]byte(bodies[c.path]), &sent)
		g, _ := json.Marshal(got)
		s, _ := json.Marshal(sent)
		if !bytes.Equal(g, s) {
			t.Errorf("paddock %s --output json changed the body:\n got %s\nwant %s", strings.Join(args, " "), g, s)
		}
	}
}

// TestSafeTextAndCell checks the escaping itself on text the server does
// not let through (it validates keys) or that no route carries today.
func TestSafeTextAndCell(t *testing.T) {
	for _, c := range []struct{ in, text, cell string }{
		{"plain ünïcode ✓ 日本", "plain ünïcode ✓ 日本", "plain ünïcode ✓ 日本"},
		{"a\tb", "a\tb", `a\tb`},
		{"a\nb", "a\n" + contIndent + "b", `a\nb`},
		{"\x1b[2J\x07\x00\x7f", `\x1b[2J\x07\x00\x7f`, `\x1b[2J\x07\x00\x7f`},
		{"\u009b\u202e\u2066", `\u009b\u202e\u2066`, `\u009b\u202e\u2066`},
		{"bad\xffutf8\r", `bad\xffutf8\r`, `bad\xffutf8\r`},
		{`back\slash`, `back\slash`, `back\slash`},
	} {
		if got := safeText(c.in); got != c.text {
			t.Errorf("safeText(%q) = %q, want %q", c.in, got, c.text)
		}
		if got := safeCell(c.in); got != c.cell {
			t.Errorf("safeCell(%q) = %q, want %q", c.in, got, c.cell)
		}
	}
}
