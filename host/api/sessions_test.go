package api_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestWalkthroughThreeSignalsGiveThreeTurnsInOrder(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setup()
		code, s := e.json("POST", "/v1/agents/notes/sessions", `{}`)
		if code != 201 || s["crash_policy"] != "restart" || s["status"] != "active" {
			t.Fatalf("create session: %d %v", code, s)
		}
		id := s["session_id"].(string)
		base := "/v1/agents/notes/sessions/" + id
		for _, m := range []string{"note buy milk", "note call mum", "list"} {
			if code, r := e.json("POST", base+"/signals", fmt.Sprintf(`{"message":%q}`, m)); code != 202 || r["created"] != true {
				t.Fatalf("signal %q: %d %v", m, code, r)
			}
		}
		var turns []any
		deadline := time.Now().Add(time.Minute)
		after := 0
		for len(turns) < 3 && time.Now().Before(deadline) {
			_, tr := e.json("GET", fmt.Sprintf("%s/transcript?after=%d&wait=5s", base, after), "")
			got, _ := tr["turns"].([]any)
			turns = append(turns, got...)
			after = int(tr["next_after"].(float64))
		}
		if len(turns) != 3 {
			t.Fatalf("got %d turns, want 3", len(turns))
		}
		last := turns[2].(map[string]any)["messages"].([]any)
		reply := last[len(last)-1].(map[string]any)["content"].(string)
		if !strings.Contains(reply, "buy milk") || !strings.Contains(reply, "call mum") {
			t.Errorf("list reply %q does not carry both notes across turns", reply)
		}
		_, s = e.json("GET", base, "")
		if s["turn_count"] != float64(3) || s["event_count"] != float64(3) || s["open_events"] != float64(0) {
			t.Errorf("session counters: %v", s)
		}
	})
}

func TestCrashPoliciesDeadLettersRedriveAndDestroyThroughTheAPI(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		newSession := func(policy string) string {
			code, s := e.json("POST", "/v1/agents/faulty/sessions", fmt.Sprintf(`{"crash_policy":%q}`, policy))
			if code != 201 || s["crash_policy"] != policy {
				t.Fatalf("create %s session: %d %v", policy, code, s)
			}
			return "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		}

		// restart: retries, then a dead letter with its error chain; redrive
		// re-opens it; discard is only for dead letters.
		r := newSession("restart")
		if c, b := e.json("POST", r+"/signals", `{"message":"error"}`); c != 202 {
			t.Fatalf("signal: %d %v", c, b)
		}
		e.waitSession(r, "a dead letter", func(s map[string]any) bool { return s["dead_letters"] == float64(1) })
		for _, path := range []string{"/v1/agents/faulty/dead-letters", r + "/dead-letters"} {
			_, dl := e.json("GET", path, "")
			list, _ := dl["dead_letters"].([]any)
			if len(list) != 1 {
				t.Fatalf("GET %s: %v", path, dl)
			}
			ev := list[0].(map[string]any)["event"].(map[string]any)
			if chain, _ := ev["errors"].([]any); len(chain) != 2 {
				t.Errorf("GET %s: error chain %v, want 2 attempts", path, ev["errors"])
			}
		}
		_, evs := e.json("GET", r+"/events?status=dead_letter", "")
		id := int(evs["events"].([]any)[0].(map[string]any)["event_id"].(float64))
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/redrive", r, id), ""); c != 200 || b["status"] != "open" {
			t.Errorf("redrive: %d %v", c, b)
		}
		e.waitSession(r, "the redriven event to dead-letter again", func(s map[string]any) bool { return s["dead_letters"] == float64(1) && s["open_events"] == float64(0) })
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 200 || b["status"] != "discarded" {
			t.Errorf("discard: %d %v", c, b)
		}
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 409 {
			t.Errorf("discard of a discarded event: %d %v, want 409", c, b)
		}

		// sleep: the session parks with sleep_ts; a signal wakes it.
		sl := newSession("sleep")
		e.json("POST", sl+"/signals", `{"message":"error"}`)
		s := e.waitSession(sl, "the session to sleep", func(s map[string]any) bool { return s["status"] == "sleeping" })
		if s["sleep_ts"] == nil || s["sleep_reason"] != "crash" {
			t.Errorf("sleeping session: %v", s)
		}
		if c, b := e.json("POST", sl+"/signals", `{"kind":"wake"}`); c != 202 || b["status"] != "active" {
			t.Errorf("wake: %d %v", c, b)
		}

		// destroy: the crash destroys the session; signals then get 410.
		d := newSession("destroy")
		e.json("POST", d+"/signals", `{"message":"error"}`)
		e.waitSession(d, "the session to be destroyed", func(s map[string]any) bool { return s["status"] == "destroyed" })
		c, b := e.json("POST", d+"/signals", `{"message":"hello?"}`)
		if code, _, _ := errorOf(b); c != 410 || code != "session_destroyed" {
			t.Errorf("signal to a destroyed session: %d %v, want 410 session_destroyed", c, b)
		}

		// DELETE destroys explicitly (idempotent).
		x := newSession("restart")
		for range 2 {
			if c, b := e.json("DELETE", x, ""); c != 200 || b["status"] != "destroyed" || b["destroy_ts"] == nil {
				t.Errorf("DELETE: %d %v", c, b)
			}
		}
		if c, _ := e.json("POST", x+"/signals", `{"message":"hi"}`); c != 410 {
			t.Errorf("signal after DELETE: %d, want 410", c)
		}
	})
}

func TestBrowseSessionsAcrossAgentsWithFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "")
	e.setup()
	e.setupFaulty()
	for _, p := range []string{"/v1/agents/notes/sessions", "/v1/agents/notes/sessions", "/v1/agents/faulty/sessions"} {
		if c, b := e.json("POST", p, `{}`); c != 201 {
			t.Fatalf("create: %d %v", c, b)
		}
	}
	if c, b := e.json("POST", "/v1/agents/notes/sessions", `{"key":"needle-1"}`); c != 201 {
		t.Fatalf("create: %d %v", c, b)
	}
	names := func(path string) []string {
		t.Helper()
		c, b := e.json("GET", path, "")
		if c != 200 {
			t.Fatalf("GET %s: %d %v", path, c, b)
		}
		var out []string
		for _, x := range b["sessions"].([]any) {
			m := x.(map[string]any)
			out = append(out, m["agent"].(string)+"/"+fmt.Sprint(m["key"]))
		}
		return out
	}
	if got := names("/v1/sessions"); len(got) != 4 {
		t.Fatalf("every session: %v", got)
	}
	if got := names("/v1/sessions?agent=notes"); len(got) != 3 {
		t.Fatalf("notes' sessions: %v", got)
	}
	if got := names("/v1/sessions?key=needle-1"); len(got) != 1 || got[0] != "notes/needle-1" {
		t.Fatalf("by key: %v", got)
	}
	if got := names("/v1/sessions?q=NEEDLE&status=active"); len(got) != 1 {
		t.Fatalf("by text and status: %v", got)
	}
	c, b := e.json("GET", "/v1/sessions?limit=2", "")
	if c != 200 || b["next_cursor"] == "" || len(b["sessions"].([]any)) != 2 {
		t.Fatalf("a page of 2: %d %v", c, b)
	}
	if got := names("/v1/sessions?limit=2&cursor=" + url.QueryEscape(b["next_cursor"].(string))); len(got) != 2 {
		t.Fatalf("the second page: %v", got)
	}
	if c, b := e.json("GET", "/v1/sessions?status=bogus", ""); c != 400 {
		t.Fatalf("bad status: %d %v", c, b)
	} else if _, field, _ := errorOf(b); field != "status" {
		t.Fatalf("bad status names %q", field)
	}
	if c, b := e.json("GET", "/v1/sessions?agent=nobody", ""); c != 404 {
		t.Fatalf("unknown agent: %d %v", c, b)
	}
	if c, b := e.json("GET", "/v1/sessions?sleep_reason=crash", ""); c != 400 {
		t.Fatalf("sleep_reason without sleeping: %d %v", c, b)
	} else if _, field, _ := errorOf(b); field != "sleep_reason" {
		t.Fatalf("sleep_reason without sleeping names %q", field)
	}
	if got := names("/v1/sessions?status=sleeping&sleep_reason=crash"); len(got) != 0 {
		t.Fatalf("sleeping for crash: %v", got)
	}
}

func TestSessionByKeyDoesNotCreate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "")
	e.setup()
	if c, b := e.json("GET", "/v1/agents/notes/sessions-by-key/user-7", ""); c != 404 {
		t.Fatalf("unknown key: %d %v", c, b)
	} else if code, _, _ := errorOf(b); code != "session_not_found" {
		t.Fatalf("unknown key: code %q", code)
	}
	if c, b := e.json("GET", "/v1/sessions?key=user-7", ""); c != 200 || len(b["sessions"].([]any)) != 0 {
		t.Fatalf("the lookup created a session: %d %v", c, b)
	}
	c, made := e.json("POST", "/v1/agents/notes/sessions", `{"key":"user-7"}`)
	if c != 201 {
		t.Fatalf("create: %d %v", c, made)
	}
	c, got := e.json("GET", "/v1/agents/notes/sessions-by-key/user-7", "")
	if c != 200 || got["session_id"] != made["session_id"] || got["key"] != "user-7" {
		t.Fatalf("lookup: %d %v, want %v", c, got, made["session_id"])
	}
	if c, b := e.json("DELETE", "/v1/agents/notes/sessions/"+made["session_id"].(string), ""); c != 200 {
		t.Fatalf("destroy: %d %v", c, b)
	}
	if c, b := e.json("GET", "/v1/agents/notes/sessions-by-key/user-7", ""); c != 404 {
		t.Fatalf("a destroyed session's key: %d %v", c, b)
	}
	if c, b := e.json("GET", "/v1/agents/nobody/sessions-by-key/user-7", ""); c != 404 {
		t.Fatalf("unknown agent: %d %v", c, b)
	}
}

// TestATranscriptWaitEndsWhenTheSessionIsDestroyed: no turn commits in a
// destroyed session, so a long-poll for one answers 410 at once — on a
// session already destroyed and on one destroyed while the poll waits —
// while its transcript stays readable without wait (found in review:
// `transcript --follow` of a destroyed session never ended).
func TestATranscriptWaitEndsWhenTheSessionIsDestroyed(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setup()
		_, s := e.json("POST", "/v1/agents/notes/sessions", `{}`)
		base := "/v1/agents/notes/sessions/" + s["session_id"].(string)
		if code, r := e.json("POST", base+"/signals", `{"message":"note one"}`); code != 202 {
			t.Fatalf("signal: %d %v", code, r)
		}
		if _, tr := e.json("GET", base+"/transcript?wait=30s", ""); len(tr["turns"].([]any)) != 1 {
			t.Fatalf("the first turn: %v", tr)
		}
		type answer struct {
			code int
			body map[string]any
			took time.Duration
		}
		waiting := make(chan answer, 1)
		go func() {
			start := time.Now()
			code, b := e.json("GET", base+"/transcript?after=1&wait=30s", "")
			waiting <- answer{code, b, time.Since(start)}
		}()
		time.Sleep(300 * time.Millisecond) // the poll is waiting (it wakes at most a second later)
		if code, b := e.json("DELETE", base, ""); code != 200 && code != 204 {
			t.Fatalf("destroy: %d %v", code, b)
		}
		a := <-waiting
		if a.code != 410 || a.body["error"].(map[string]any)["code"] != "session_destroyed" || a.took > 10*time.Second {
			t.Errorf("a wait when the session was destroyed: %d %v after %s, want 410 session_destroyed within a poll", a.code, a.body, a.took)
		}
		start := time.Now()
		if code, b := e.json("GET", base+"/transcript?after=1&wait=30s", ""); code != 410 || time.Since(start) > 10*time.Second {
			t.Errorf("a wait on a destroyed session: %d %v after %s, want 410 at once", code, b, time.Since(start))
		}
		if code, tr := e.json("GET", base+"/transcript", ""); code != 200 || len(tr["turns"].([]any)) != 1 {
			t.Errorf("the destroyed session's transcript without wait: %d %v, want its one turn", code, tr)
		}
	})
}
