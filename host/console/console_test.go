package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/console"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// cookie returns the Set-Cookie of name in resp, or nil.
func cookie(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// flashOf returns the flash message an action's answer carries.
func flashOf(resp *http.Response) string {
	c := cookie(resp, console.FlashCookie)
	if c == nil {
		return ""
	}
	msg, _ := url.QueryUnescape(c.Value)
	return msg
}

func TestFlashIsShownOnceAndNeverTakenFromTheURL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	b := e.browser()
	sp := sessionPath(notes, x)
	if _, body := b.get(sp + "?flash=Your+token+expired"); strings.Contains(body, "token expired") {
		t.Fatal("the page shows a flash message taken from its URL")
	}
	resp, _ := b.post(sp+"/signal", url.Values{"csrf": {b.csrf(sp)}, "kind": {"wake"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("wake: %d", resp.StatusCode)
	}
	if _, body := b.get(sp); !strings.Contains(body, `id="flash">wake accepted`) {
		t.Fatalf("the flash is not shown after the action:\n%s", body)
	}
	if _, body := b.get(sp); strings.Contains(body, `id="flash"`) {
		t.Fatal("the flash is shown twice")
	}
}

func TestLoginSetsHttpOnlyStrictCookieAndRefusesAWrongToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "s3cret-token")
	b := e.browser()

	// Not logged in: every page sends the browser to the login form.
	resp, _ := b.get("/ui/sessions?agent=x")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/login?next=%2Fui%2Fsessions%3Fagent%3Dx" {
		t.Fatalf("page before login: %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// "/" redirects to the console.
	if resp, _ := b.get("/"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("/: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	// A wrong token: refused, no session cookie.
	resp, body := b.post("/ui/login", url.Values{"csrf": {b.csrf("/ui/login")}, "token": {"wrong"}})
	if resp.StatusCode != http.StatusUnauthorized || cookie(resp, api.SessionCookie) != nil || !strings.Contains(body, "wrong token") {
		t.Fatalf("wrong token: %d cookie %v\n%s", resp.StatusCode, cookie(resp, api.SessionCookie), body)
	}
	if resp, _ := b.get("/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after a wrong token the overview answers %d, want the login redirect", resp.StatusCode)
	}

	// The right token: an HttpOnly, SameSite=Strict cookie that is not the
	// token, and a redirect inside the console only.
	resp, body = b.post("/ui/login", url.Values{"csrf": {b.csrf("/ui/login")}, "token": {e.token}, "next": {"https://evil.example/"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("login: %d %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	c := cookie(resp, api.SessionCookie)
	switch {
	case c == nil:
		t.Fatal("login set no session cookie")
	case !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/":
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/", c)
	case strings.Contains(c.Value, e.token):
		t.Fatal("the session cookie holds the token")
	}
	if resp, body := b.get("/ui/"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "Overview") {
		t.Fatalf("overview after login: %d\n%s", resp.StatusCode, body)
	}

	// Log out: the cookie is cleared.
	resp, _ = b.post("/ui/logout", url.Values{"csrf": {b.csrf("/ui/")}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := b.get("/ui/"); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("after logout the overview answers %d, want the login redirect", resp.StatusCode)
	}
}

func TestSessionCookieOpensTheAPIOnlyForReads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "tok")
	a := e.agent("notes", wasmtest.Notes)
	x := e.session(a, "")
	b := e.browser()
	b.login()
	// The stream route (EventSource cannot send a header) and other reads.
	for _, p := range []string{"/v1/agents", "/v1/agents/notes/sessions/" + x.SessionID} {
		if resp, body := b.get(p); resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s with the session cookie: %d %s", p, resp.StatusCode, body)
		}
	}
	// A write with the cookie and no bearer token is refused, and wrote nothing.
	req, _ := http.NewRequest("POST", e.url+"/v1/agents/notes/sessions", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST with only the session cookie: %d, want 401", resp.StatusCode)
	}
	if xs, _, _ := e.svc.ListSessions(context.Background(), a, "", 0); len(xs) != 1 {
		t.Fatalf("%d sessions after a refused create, want 1", len(xs))
	}
	// A forged cookie opens nothing.
	req, _ = http.NewRequest("GET", e.url+"/v1/agents", nil)
	req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: "forged-login-id"})
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET with a forged cookie: %d, want 401", resp.StatusCode)
	}
}

func TestEveryPostWithoutAValidCSRFTokenIsRefusedAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "tok")
	notes := e.agent("notes", wasmtest.Notes)
	faulty := e.agent("faulty", wasmtest.Faulty)
	x := e.session(notes, "")
	e.signal(notes, x, "ask what colour?") // an open wait ask-1
	f := e.session(faulty, "")
	dl := e.signal(faulty, f, "error")
	if dl.Status != store.EventDeadLetter {
		t.Fatalf("faulty error: %s, want dead_letter", dl.Status)
	}
	b := e.browser()
	b.login()
	good := b.csrf("/ui/")

	sp := sessionPath(notes, x)
	posts := []struct {
		path string
		form url.Values
	}{
		{sp + "/signal", url.Values{"kind": {"message"}, "message": {"note sneaky"}}},
		{sp + "/signal", url.Values{"kind": {"wake"}}},
		{sp + "/destroy", url.Values{"confirm": {"yes"}}},
		{sp + "/waits/ask-1", url.Values{"data": {`"blue"`}}},
		{"/ui/agents/notes/sessions", url.Values{"key": {"new"}}},
		{"/ui/agents/faulty/dead-letters", url.Values{"op": {fmt.Sprintf("redrive:%s:%d", f.SessionID, dl.ID)}}},
		{"/ui/agents/faulty/dead-letters", url.Values{"op": {"discard"}, "ev": {fmt.Sprintf("%s:%d", f.SessionID, dl.ID)}}},
		{"/ui/logout", url.Values{}},
		{"/ui/login", url.Values{"token": {"tok"}}},
	}
	cases := []struct {
		name string
		csrf string
		hdr  []string
	}{
		{"no token", "", nil},
		{"wrong token", strings.Repeat("A", len(good)), nil},
		{"another origin", good, []string{"Origin", "https://evil.example"}},
		{"cross-site fetch", good, []string{"Sec-Fetch-Site", "cross-site"}},
		{"sibling-site fetch", good, []string{"Sec-Fetch-Site", "same-site"}},
	}
	for _, p := range posts {
		for _, c := range cases {
			form := url.Values{}
			for k, v := range p.form {
				form[k] = v
			}
			if c.csrf != "" {
				form.Set("csrf", c.csrf)
			}
			resp, body := b.post(p.path, form, c.hdr...)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s (%s): %d, want 403\n%s", p.path, c.name, resp.StatusCode, body)
			}
			if resp.Header.Get("Content-Security-Policy") != console.CSP {
				t.Errorf("POST %s (%s): no CSP on the refusal", p.path, c.name)
			}
		}
	}
	// Nothing was written.
	now, err := e.svc.GetSession(ctx, notes, x.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if now.Status == store.SessionDestroyed || now.EventCount != x.EventCount+1 {
		t.Fatalf("session after refused posts: %s, %d events (want not destroyed, %d)", now.Status, now.EventCount, x.EventCount+1)
	}
	if w, err := e.svc.GetWait(ctx, now, "ask-1"); err != nil || w.Status != store.WaitOpen {
		t.Fatalf("wait after refused posts: %+v %v, want open", w, err)
	}
	if xs, _, _ := e.svc.ListSessions(ctx, notes, "", 0); len(xs) != 1 {
		t.Fatalf("%d notes sessions after refused posts, want 1", len(xs))
	}
	if ev, _, _ := e.svc.GetEvent(ctx, f, dl.ID); ev.Status != store.EventDeadLetter || ev.Redrives != 0 {
		t.Fatalf("dead letter after refused posts: %s, %d redrives", ev.Status, ev.Redrives)
	}
	if resp, _ := b.get("/ui/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the refused logout logged out: %d", resp.StatusCode)
	}

	// With the token, the same forms work: the wait resolves, the dead
	// letter is redriven.
	if resp, body := b.post(sp+"/waits/ask-1", url.Values{"csrf": {good}, "data": {"blue"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resolve: %d\n%s", resp.StatusCode, body)
	}
	if w, _ := e.svc.GetWait(ctx, now, "ask-1"); w.Status != store.WaitResolved || string(w.Resolution) != `"blue"` {
		t.Fatalf("wait after resolve: %s %s", w.Status, w.Resolution)
	}
	resp, body := b.post("/ui/agents/faulty/dead-letters", url.Values{"csrf": {good}, "op": {"redrive"}, "ev": {fmt.Sprintf("%s:%d", f.SessionID, dl.ID)}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(flashOf(resp), "redrive: 1 done") {
		t.Fatalf("redrive: %d %q\n%s", resp.StatusCode, flashOf(resp), body)
	}
	e.waitEvent(f, dl.ID, func(ev store.Event) bool { return ev.Redrives == 1 })
}

// inlineRE finds what the CSP forbids: a script without src, a style
// element or attribute, an event handler attribute.
var inlineRE = regexp.MustCompile(`(?i)<script(\s[^>]*)?>\s*[^<\s]|<script>|<style|\sstyle=|\son[a-z]+=`)

func TestEveryPageHasTheCSPAndNoInlineScriptOrStyle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "tok")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "k1")
	ev := e.signal(notes, x, "ask a question")
	faulty := e.agent("faulty", wasmtest.Faulty)
	f := e.session(faulty, "")
	e.signal(faulty, f, "error")
	b := e.browser()
	pages := []string{
		"/ui/login", "/ui/", "/ui/agents", "/ui/agents/notes", "/ui/sessions", "/ui/sessions?agent=notes&status=sleeping",
		sessionPath(notes, x), fmt.Sprintf("%s/events/%d", sessionPath(notes, x), ev.ID), sessionPath(notes, x) + "/destroy",
		"/ui/dead-letters?agent=faulty", "/ui/modules", "/ui/no-such-page", "/ui/agents/nobody",
	}
	check := func(p string) {
		resp, body := b.get(p)
		if got := resp.Header.Get("Content-Security-Policy"); got != console.CSP {
			t.Errorf("%s (%d): CSP %q", p, resp.StatusCode, got)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: X-Frame-Options %q, X-Content-Type-Options %q", p, resp.Header.Get("X-Frame-Options"), resp.Header.Get("X-Content-Type-Options"))
		}
		if m := inlineRE.FindString(body); m != "" {
			t.Errorf("%s: inline script or style %q", p, m)
		}
	}
	check("/ui/sessions") // before login: the redirect
	b.login()
	for _, p := range pages {
		check(p)
	}
	for _, p := range []string{"/ui/static/live.js", "/ui/static/console.css"} {
		resp, _ := b.get(p)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Security-Policy") != console.CSP {
			t.Errorf("%s: %d, CSP %q", p, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
	// No directory listing of the static files.
	if resp, _ := b.get("/ui/static/"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/ui/static/: %d, want 404 (no listing)", resp.StatusCode)
	}
	// Every page is reachable from the navigation bar.
	_, body := b.get("/ui/")
	for _, p := range []string{"/ui/agents", "/ui/sessions", "/ui/dead-letters", "/ui/modules"} {
		if !strings.Contains(body, `href="`+p+`?namespace=default"`) {
			t.Errorf("the nav bar has no link to %s", p)
		}
	}
}

func TestAgentTextIsEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	e.signal(notes, x, "note <script>alert(1)</script>")
	e.signal(notes, x, "note <img src=x onerror=alert(1)>")
	e.signal(notes, x, "list")
	b := e.browser() // no token: the console is open, like the API
	resp, body := b.get(sessionPath(notes, x))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session page: %d\n%s", resp.StatusCode, body)
	}
	for _, raw := range []string{"<script>alert", "<img src=x", "onerror=alert(1)>"} {
		if strings.Contains(body, raw) {
			t.Errorf("the page holds %q unescaped", raw)
		}
	}
	for _, esc := range []string{"1. &lt;script&gt;alert(1)&lt;/script&gt;", "2. &lt;img src=x onerror=alert(1)&gt;"} {
		if !strings.Contains(body, esc) {
			t.Errorf("the agent's reply %q is not on the page", esc)
		}
	}
	if !strings.Contains(body, "&#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;") {
		t.Error("the state's JSON is not shown escaped")
	}
}

func TestSessionsPageFiltersAndPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	other := e.agent("other", wasmtest.Notes)
	var keys []string
	for i := range 7 {
		keys = append(keys, fmt.Sprintf("key-%d", i))
		e.session(notes, keys[i])
	}
	e.session(other, "only-other")
	gone := e.session(notes, "")
	if _, err := e.svc.DestroySession(ctx, gone); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	rowRE := regexp.MustCompile(`<td><a href="/ui/agents/([a-z]+)/sessions/([^"?]+)\?namespace=default">`)
	rows := func(p string) ([]string, string) {
		resp, body := b.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d\n%s", p, resp.StatusCode, body)
		}
		var out []string
		for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1]+"/"+m[2])
		}
		next := ""
		if m := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
		return out, next
	}
	// All agents, three at a time: every session once, by agent then id.
	seen := map[string]bool{}
	p := "/ui/sessions?limit=3"
	for pages := 0; p != ""; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		var got []string
		got, p = rows(p)
		if len(got) > 3 {
			t.Fatalf("page of %d rows, limit 3", len(got))
		}
		for _, r := range got {
			if seen[r] {
				t.Fatalf("%s on two pages", r)
			}
			seen[r] = true
		}
	}
	if len(seen) != 9 {
		t.Fatalf("paging showed %d sessions, want 9", len(seen))
	}
	if got, _ := rows("/ui/sessions?agent=notes&key=key-4"); len(got) != 1 {
		t.Fatalf("key filter: %v", got)
	}
	if got, _ := rows("/ui/sessions?status=destroyed"); len(got) != 1 || got[0] != "notes/"+gone.SessionID {
		t.Fatalf("status filter: %v", got)
	}
	if got, _ := rows("/ui/sessions?q=ONLY-"); len(got) != 1 || !strings.HasPrefix(got[0], "other/") {
		t.Fatalf("text filter: %v", got)
	}
	if resp, body := b.get("/ui/sessions?status=bogus"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "status") {
		t.Fatalf("bad status: %d\n%s", resp.StatusCode, body)
	}
	// An indexed filter reads only what matches; a text filter reads at
	// most MaxBrowseScan of those and says where to go on.
	page, err := e.svc.BrowseSessions(ctx, service.SessionFilter{Key: "none"})
	if err != nil || len(page.Sessions) != 0 || page.Scanned != 0 || page.Next != "" {
		t.Fatalf("browse by key: %+v %v", page, err)
	}
	page, err = e.svc.BrowseSessions(ctx, service.SessionFilter{Text: "no such text"})
	if err != nil || len(page.Sessions) != 0 || page.Scanned != 9 || page.Partial {
		t.Fatalf("browse by text: %+v %v", page, err)
	}
}

func TestSessionActionsFromForms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	b := e.browser()
	sp := sessionPath(notes, x)
	tok := b.csrf(sp)
	post := func(form url.Values, want int) string {
		t.Helper()
		form.Set("csrf", tok)
		resp, body := b.post(sp+"/signal", form)
		if resp.StatusCode != want {
			t.Fatalf("signal %v: %d, want %d\n%s", form, resp.StatusCode, want, body)
		}
		if want == http.StatusSeeOther {
			return flashOf(resp)
		}
		return body
	}
	// A message and a steer (none in flight: queued like a message) run.
	post(url.Values{"kind": {"message"}, "message": {"note one"}}, http.StatusSeeOther)
	if loc := post(url.Values{"kind": {"steer"}, "message": {"count"}}, http.StatusSeeOther); !strings.Contains(loc, "steer accepted") {
		t.Fatalf("steer flash: %q", loc)
	}
	evs, err := e.svc.ListEvents(ctx, x, "", service.Page{})
	if err != nil || len(evs) != 2 {
		t.Fatalf("events: %v %v", evs, err)
	}
	e.waitEvent(x, evs[1].ID, func(ev store.Event) bool { return ev.Status == store.EventDone })
	// Cancel with nothing in flight: the service's refusal, as a page.
	if body := post(url.Values{"kind": {"cancel"}}, http.StatusConflict); !strings.Contains(body, "no turn is in flight") {
		t.Fatalf("cancel: %s", body)
	}
	// An empty message: the service names the field.
	if body := post(url.Values{"kind": {"message"}}, http.StatusBadRequest); !strings.Contains(body, "message") {
		t.Fatalf("empty message: %s", body)
	}
	// Wake answers with the session's status.
	if loc := post(url.Values{"kind": {"wake"}}, http.StatusSeeOther); !strings.Contains(loc, "wake accepted") {
		t.Fatalf("wake flash: %q", loc)
	}
	// Destroy needs the confirmation.
	if resp, _ := b.post(sp+"/destroy", url.Values{"csrf": {tok}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("destroy without confirm: %d", resp.StatusCode)
	}
	if resp, _ := b.post(sp+"/destroy", url.Values{"csrf": {tok}, "confirm": {"yes"}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("destroy: %d", resp.StatusCode)
	}
	if now, _ := e.svc.GetSession(ctx, notes, x.SessionID); now.Status != store.SessionDestroyed {
		t.Fatalf("after destroy: %s", now.Status)
	}
	_, body := b.get(sp)
	if strings.Contains(body, "data-stream=") || strings.Contains(body, `id="signal-form"`) {
		t.Fatal("a destroyed session's page still offers the stream or the actions")
	}
}

func TestDeadLettersRedriveAndDiscardOneOrMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	faulty := e.agent("faulty", wasmtest.Faulty)
	var dls []store.Event
	var xs []store.Session
	for range 3 {
		x := e.session(faulty, "")
		xs = append(xs, x)
		dls = append(dls, e.signal(faulty, x, "error"))
	}
	b := e.browser()
	_, body := b.get("/ui/dead-letters?agent=faulty")
	for i, dl := range dls {
		if !strings.Contains(body, fmt.Sprintf(`value="%s:%d"`, xs[i].SessionID, dl.ID)) {
			t.Fatalf("dead letter %d is not listed", dl.ID)
		}
	}
	tok := b.csrf("/ui/dead-letters?agent=faulty")
	id := func(i int) string { return fmt.Sprintf("%s:%d", xs[i].SessionID, dls[i].ID) }
	// One, by its row's button (a checked box elsewhere is ignored).
	resp, _ := b.post("/ui/agents/faulty/dead-letters", url.Values{"csrf": {tok}, "op": {"discard:" + id(0)}, "ev": {id(1)}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(flashOf(resp), "discard: 1 done") {
		t.Fatalf("discard one: %d %q", resp.StatusCode, flashOf(resp))
	}
	// Many: the checked ones; the discarded one is refused by name.
	resp, _ = b.post("/ui/agents/faulty/dead-letters", url.Values{"csrf": {tok}, "op": {"discard"}, "ev": {id(0), id(1), id(2)}})
	if loc := flashOf(resp); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "discard: 2 done, 1 refused") {
		t.Fatalf("discard many: %d %q", resp.StatusCode, loc)
	}
	for i := range dls {
		if ev, _, _ := e.svc.GetEvent(ctx, xs[i], dls[i].ID); ev.Status != store.EventDiscarded {
			t.Fatalf("event %d: %s, want discarded", dls[i].ID, ev.Status)
		}
	}
	if _, body := b.get("/ui/dead-letters?agent=faulty"); !strings.Contains(body, `id="no-dead-letters"`) {
		t.Fatal("the page still lists dead letters")
	}
}

func TestTranscriptShowsTheLastTurnsAndPagesBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	for i := 1; i <= 55; i++ {
		e.signal(notes, x, fmt.Sprintf("note n%02d", i))
	}
	b := e.browser()
	turnRE := regexp.MustCompile(`data-turn="(\d+)"`)
	turns := func(p string) (first, last string, n int, body string) {
		t.Helper()
		resp, body := b.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		ms := turnRE.FindAllStringSubmatch(body, -1)
		if len(ms) == 0 {
			t.Fatalf("%s shows no turn", p)
		}
		return ms[0][1], ms[len(ms)-1][1], len(ms), body
	}
	sp := sessionPath(notes, x)
	first, last, n, body := turns(sp)
	if first != "6" || last != "55" || n != 50 || !strings.Contains(body, "data-stream=") || !strings.Contains(body, "?turns_after=0") {
		t.Fatalf("latest page: turns %s–%s (%d), live %v", first, last, n, strings.Contains(body, "data-stream="))
	}
	first, last, n, body = turns(sp + "?turns_after=0")
	if first != "1" || last != "50" || n != 50 || strings.Contains(body, "data-stream=") {
		t.Fatalf("older page: turns %s–%s (%d), live %v", first, last, n, strings.Contains(body, "data-stream="))
	}
	if resp, _ := b.get(sp + "?turns_after=-3"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("turns_after=-3: %d", resp.StatusCode)
	}
}
