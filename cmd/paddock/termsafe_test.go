package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
// and `dead-letters` against the real API with an event dead-lettered by
// the faulty agent: its payload (the signal's message) carries terminal
// controls and a forged line, its error chain real multi-line errors (a
// Go panic and its goroutine dump). The human output escapes the controls
// and keeps a multi-line error's lines indented; --output json prints the
// body unchanged.
//
// No agent can make its error text carry controls (the faulty agent's
// errors are fixed texts; a turn error quotes the guest's stderr only
// when the guest dies, with the runtime's own words), so the escaping of
// such an error is checked on the formatting functions themselves in
// TestErrorCellsEscapeControls.
func TestErrorsAndPayloadsEscapeControls(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20, fastRetries)
	ra.faultyAgent(ctx, "ag")
	s, err := ra.api.CreateSession(ctx, "ag", apiclient.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg := "crash " + hostile + "\nline2\n── turn 99"
	if _, err := ra.api.SendSignal(ctx, "ag", s.SessionID, apiclient.Signal{Message: msg}); err != nil {
		t.Fatal(err)
	}
	evs := ra.waitEvents(ctx, "ag", s.SessionID, func(evs []apiclient.Event) bool {
		return len(evs) == 1 && evs[0].Status == "dead_letter"
	})
	ev, err := ra.api.GetEvent(ctx, "ag", s.SessionID, evs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	var payload struct{ Message string }
	if err := json.Unmarshal(ev.Payload, &payload); err != nil || payload.Message != msg {
		t.Fatalf("the store changed the message: %q %v, want %q", payload.Message, err, msg)
	}
	if !strings.Contains(ev.LastError, "\n") || len(ev.Errors) == 0 || !strings.Contains(ev.Errors[0].Error, "\n") {
		t.Fatalf("want multi-line errors, got %+v", ev)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := ra.run(ctx, args...)
		if err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	id := fmt.Sprint(ev.ID)
	base := "/v1/agents/ag/sessions/" + s.SessionID
	for _, c := range []struct {
		args []string
		path string
	}{
		{[]string{"events", "ag", s.SessionID}, base + "/events?limit=1000"},
		{[]string{"event", "show", "ag", s.SessionID, id}, base + "/events/" + id},
		{[]string{"dead-letters", "ag", s.SessionID}, base + "/dead-letters?limit=1000"},
	} {
		args := c.args
		out := run(args...)
		if r, ok := hasControls(out); ok {
			t.Errorf("paddock %s printed control %U raw:\n%q", strings.Join(args, " "), r, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "── turn") || strings.HasPrefix(line, "line2") || strings.HasPrefix(line, "goroutine") {
				t.Errorf("paddock %s: a payload or error forged a line: %q", strings.Join(args, " "), line)
			}
		}
		js := run(append(args, "--output", "json")...)
		if got, sent := canonJSON(t, js), ra.getJSON(c.path); !bytes.Equal(got, sent) {
			t.Errorf("paddock %s --output json changed the body:\n got %s\nwant %s", strings.Join(args, " "), got, sent)
		}
	}
	if out := run("events", "ag", s.SessionID); !strings.Contains(out, `\u009b31m`) || !strings.Contains(out, `\u202e`) {
		t.Errorf("paddock events does not show the payload's controls escaped:\n%s", out)
	}
	// Every line of an error after its first is indented: only the CLI's
	// own lines start with "event " or "  attempt ".
	out := run("event", "show", "ag", s.SessionID, id)
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if !strings.HasPrefix(line, "event ") && !strings.HasPrefix(line, "  attempt ") && !strings.HasPrefix(line, contIndent) {
			t.Errorf("paddock event show: a line of an error is not indented: %q", line)
		}
	}
	_, second, _ := strings.Cut(ev.Errors[0].Error, "\n")
	second, _, _ = strings.Cut(second, "\n")
	if strings.Count(out, "  attempt ") != len(ev.Errors) || !strings.Contains(out, "\n"+contIndent+strings.TrimSpace(second)) {
		t.Errorf("paddock event show does not show the error chain with indented lines (line 2 %q):\n%s", second, out)
	}
}

// TestErrorCellsEscapeControls checks the formatting of an event error
// that carries terminal controls and a forged line, which no agent can
// produce through the API (see TestErrorsAndPayloadsEscapeControls): the
// LAST ERROR cells of `paddock events` and `dead-letters` and the error
// chain of `event show` escape the controls and forge no line.
func TestErrorCellsEscapeControls(t *testing.T) {
	lastErr := hostile + "\nline2\n── turn 99"
	for name, out := range map[string]string{
		"events":       lastErrorCell("dead_letter", lastErr),
		"events done":  lastErrorCell("done", lastErr),
		"dead-letters": oneLine(lastErr, 100),
		"event show":   "  attempt 1 (epoch 1, counted against max_attempts): " + safeText(firstLines(lastErr, 6)),
	} {
		if r, ok := hasControls(out); ok {
			t.Errorf("%s printed control %U raw:\n%q", name, r, out)
		}
		if !strings.Contains(out, `\x1b]0;pwned\x07\x1b[2J`) {
			t.Errorf("%s does not show the error escaped:\n%s", name, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "── turn") {
				t.Errorf("%s: an error forged a line: %q", name, line)
			}
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
