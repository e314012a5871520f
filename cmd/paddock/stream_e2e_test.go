package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/store/pgtest"
)

// streamedCompletion writes an OpenAI-style streamed chat completion: one
// content delta per part, then the finish reason and [DONE].
func streamedCompletion(w http.ResponseWriter, parts ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	for _, p := range parts {
		b, _ := json.Marshal(map[string]any{"id": "c1", "model": "gpt-test",
			"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": p}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	fmt.Fprint(w, `data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}`+"\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestSignalSendStreamEndToEnd runs `paddock serve` as built and `paddock
// signal send --stream` against it: an agent's streamed model call reaches
// the terminal as text while its turn runs (the host writes chunk frames
// and pokes the stream hub, the SSE route serves them), then [committed];
// `session stream --json` replays the same turn with its ids, counted in
// /metrics until the client goes away.
func TestSignalSendStreamEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	t.Parallel()
	model := newModelServer(t, func(n int, body map[string]any, w http.ResponseWriter, r *http.Request) {
		streamedCompletion(w, "Hel", "lo, ", "world\x1b[2J")
	})
	dir := t.TempDir()
	addr := freePort(t)
	srv := startServer(t, hcConfig(t, dir, addr, pgtest.DSN(t), model.URL, "", nil, ""), addr)
	sess := srv.cli("session", "create", "hc")
	out := srv.cli("signal", "send", "hc", sess, callsMessage(t, modelCall("hi")), "--stream")
	for _, want := range []string{"[event 1 started, attempt 1]\n    Hello, world\\x1b[2J\n[committed]"} {
		if !strings.Contains(out, want) {
			t.Errorf("signal send --stream printed:\n%s\nwant it to hold %q", out, want)
		}
	}
	cmd := exec.Command(paddockBin(t), "--server", "http://"+addr, "session", "stream", "hc", sess, "--json")
	stdout := &lockedBuffer{}
	cmd.Stdout = stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "session stream --json to print the commit", 60e9, func() bool { return strings.Contains(stdout.String(), `"turn.committed"`) })
	if n, w := metric(addr, "paddock_stream_subscribers"), metric(addr, "paddock_stream_watched_sessions"); n != 1 || w != 1 {
		t.Errorf("while one client streams: paddock_stream_subscribers %v, paddock_stream_watched_sessions %v, want 1 and 1", n, w)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	// The client went away: its subscription ends with it.
	waitUntil(t, "the subscription to end with its client", 60e9, func() bool {
		return metric(addr, "paddock_stream_subscribers") == 0 && metric(addr, "paddock_stream_watched_sessions") == 0
	})
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var ev struct{ ID, Event string }
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("--json line %q: %v", l, err)
		}
		names = append(names, ev.Event)
	}
	if names[0] != "turn.started" || names[len(names)-1] != "turn.committed" || !strings.Contains(strings.Join(names, " "), "chunk") {
		t.Errorf("session stream --json: %v", names)
	}
}
