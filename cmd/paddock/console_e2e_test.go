package main

import (
	"bufio"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestServeServesTheConsole: a real `paddock serve` with an auth token
// redirects / to the console, logs a browser in through the form, runs a
// message sent from the session page's form, and opens the session stream
// (the live transcript's route) to the console's cookie.
func TestServeServesTheConsole(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	s := startServerEnv(t, writeConfig(t, "sqlite", addr), addr, "PADDOCK_AUTH_TOKEN=e2e-token")
	base := "http://" + s.addr
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(p string) (*http.Response, string) {
		t.Helper()
		resp, err := c.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	post := func(p string, form url.Values) *http.Response {
		t.Helper()
		resp, err := c.PostForm(base+p, form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	csrfRE := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	csrf := func(p string) string {
		t.Helper()
		_, body := get(p)
		m := csrfRE.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s has no csrf field:\n%s", p, body)
		}
		return m[1]
	}

	if resp, _ := get("/"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("/: %d %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := get("/ui/agents"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("/ui/agents before login: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := post("/ui/login", url.Values{"csrf": {csrf("/ui/login")}, "token": {"e2e-token"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	resp := post("/ui/agents/notes/sessions", url.Values{"csrf": {csrf("/ui/agents/notes")}, "key": {"e2e"}})
	session := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(session, "/ui/agents/notes/sessions/") {
		t.Fatalf("create session: %d %q", resp.StatusCode, session)
	}
	session, _, _ = strings.Cut(session, "?")
	if resp := post(session+"/signal", url.Values{"csrf": {csrf(session)}, "kind": {"message"}, "message": {"note <b>bold</b>"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("signal: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, body := get(session)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") == "" {
			t.Fatalf("session page: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
		if strings.Contains(body, "noted (1)") {
			if strings.Contains(body, "<b>bold") || !strings.Contains(body, "note &lt;b&gt;bold&lt;/b&gt;") {
				t.Fatal("the message is not shown escaped")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reply never showed on the session page:\n%s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The live transcript's route takes the cookie (a GET); the API's
	// writes do not.
	id := strings.TrimPrefix(session, "/ui/agents/notes/sessions/")
	sresp, err := c.Get(base + "/v1/agents/notes/sessions/" + id + "/stream?after=0")
	if err != nil {
		t.Fatal(err)
	}
	if sresp.StatusCode != http.StatusOK || !strings.HasPrefix(sresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream with the console cookie: %d %q", sresp.StatusCode, sresp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() && sc.Text() != "event: turn.committed" {
	}
	sresp.Body.Close()
	if sc.Err() != nil {
		t.Fatalf("reading the stream: %v", sc.Err())
	}
	wresp, err := c.PostForm(base+"/v1/agents/notes/sessions", url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	wresp.Body.Close()
	if wresp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("an API write with only the console cookie: %d, want 401", wresp.StatusCode)
	}
}
