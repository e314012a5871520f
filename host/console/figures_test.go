package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestFigures measures, for the README and the note, the time to
// the first render of the sessions page with 100,000 sessions in the store
// and the bytes of a session page. It runs only with
// PADDOCK_CONSOLE_FIGURES=1 (it writes 100,000 sessions) and asserts no
// duration: it logs them.
func TestFigures(t *testing.T) {
	if os.Getenv("PADDOCK_CONSOLE_FIGURES") != "1" {
		t.Skip("set PADDOCK_CONSOLE_FIGURES=1 to measure the console's figures")
	}
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	for i := range 10 {
		e.signal(notes, x, fmt.Sprintf("note number %d with some text", i))
	}
	e.signal(notes, x, "list")
	start := time.Now()
	const n = 100_000
	for i := range n - 1 {
		if _, _, err := e.st.CreateSession(ctx, store.CreateSessionParams{AgentUID: notes.UID, SessionID: uuid.NewString(),
			Key: fmt.Sprintf("k-%d", i), DefaultCrashPolicy: store.CrashRestart}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("created %d sessions in %s", n, time.Since(start).Round(time.Millisecond))
	b := e.browser()
	for _, p := range []string{"/ui/sessions", "/ui/sessions?agent=notes", "/ui/sessions?status=destroyed", "/ui/sessions?key=k-99990", "/ui/sessions?q=no-such-text"} {
		for range 2 { // the second is warm
			start := time.Now()
			resp, body := b.get(p)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d", p, resp.StatusCode)
			}
			t.Logf("%s: %d bytes in %s", p, len(body), time.Since(start).Round(time.Millisecond))
		}
	}
	resp, body := b.get(sessionPath(notes, x))
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.StatusCode)
	}
	css, _ := b.get("/ui/static/console.css")
	js, _ := b.get("/ui/static/live.js")
	t.Logf("session page (11 turns, 11 events, JSON state): %d bytes HTML; console.css %d, live.js %d (uncompressed, cacheable)",
		len(body), css.ContentLength, js.ContentLength)
}
