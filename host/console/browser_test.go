package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// chromium returns the path of Debian's chromium (or another Chrome on
// PATH). Absent, the test is skipped, unless REQUIRE_BROWSER_TEST=1
// (CI installs it: .ci/run), where it fails.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("REQUIRE_BROWSER_TEST") == "1" {
		t.Fatal("no chromium on PATH and REQUIRE_BROWSER_TEST=1 (apt-get install chromium)")
	}
	t.Skip("no chromium on PATH: the browser test is skipped (apt-get install chromium; REQUIRE_BROWSER_TEST=1 makes this a failure)")
	return ""
}

// browserEvents records what the page did that the test must see:
// dialogs (an XSS would open one), exceptions and console/CSP messages.
type browserEvents struct {
	mu       sync.Mutex
	dialogs  []string
	problems []string
}

func (b *browserEvents) add(dialog bool, s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if dialog {
		b.dialogs = append(b.dialogs, s)
	} else {
		b.problems = append(b.problems, s)
	}
}

func (b *browserEvents) check(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dialogs) > 0 {
		t.Fatalf("the page opened dialogs (script ran): %q", b.dialogs)
	}
	if len(b.problems) > 0 {
		t.Fatalf("the page logged problems: %q", b.problems)
	}
}

func TestBrowserDrivesASession(t *testing.T) {
	exe := chromium(t)
	t.Parallel()
	ctx := context.Background()
	e := newEnvNS(t, "browser-token", "a")
	notes := e.agent("notes", wasmtest.Notes)
	e.agentIn("a", "anotes", wasmtest.Notes)
	faulty := e.agent("faulty", wasmtest.Faulty)
	f := e.session(faulty, "broken")
	dl := e.signal(faulty, f, "error")
	if dl.Status != store.EventDeadLetter {
		t.Fatalf("faulty: %s, want dead_letter", dl.Status)
	}

	shots := t.TempDir()
	extra := os.Getenv("SCREENSHOTS_DIR")
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	defer cancelBrowser()
	bctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()

	var ev browserEvents
	// Subscribed before the first page: a dialog (what an XSS would open)
	// is recorded and closed; exceptions and errors logged by the page (a
	// CSP violation is one) are recorded.
	dialogs := chromedp.Events(bctx, page.JavascriptDialogOpening)
	exceptions := chromedp.Events(bctx, cdpruntime.ExceptionThrown)
	entries := chromedp.Events(bctx, log.EntryAdded)
	go func() {
		for d, err := range dialogs {
			if err != nil {
				return
			}
			ev.add(true, d.Message)
			_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	go func() {
		for x, err := range exceptions {
			if err != nil {
				return
			}
			ev.add(false, "exception: "+x.ExceptionDetails.Text)
		}
	}()
	go func() {
		for x, err := range entries {
			if err != nil {
				return
			}
			// A 403 the test asks for (the forged CSRF token) is expected.
			if x.Entry.Level == log.EntryLevelError && !strings.Contains(x.Entry.Text, "403") {
				ev.add(false, "log: "+x.Entry.Text+" "+x.Entry.URL)
			}
		}
	}()
	if _, err := chromedp.Call(bctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(js string) int {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		for _, dir := range []string{shots, extra} {
			if dir == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), buf, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// waitText polls the text of sel until it contains want.
	waitText := func(sel, want string) string {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
			if err == nil && strings.Contains(s, want) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never showed %q (has %q)", sel, want, s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Log in through the form.
	run("open the console", chromedp.Navigate(e.url+"/ui/sessions"), chromedp.WaitVisible(chromedp.CSS("#token")))
	shot("login")
	run("log in", chromedp.SendKeys(chromedp.CSS("#token"), e.token), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("form.filters")))

	// Create a session of the notes agent from its page.
	run("create a session", chromedp.Navigate(e.url+"/ui/agents/notes"), chromedp.WaitVisible(chromedp.CSS("#create-session")))
	shot("agent")
	run("create a session", chromedp.SendKeys(chromedp.CSS("#new-key"), "from-browser"), chromedp.Click(chromedp.CSS("#create-session")),
		chromedp.WaitVisible(chromedp.CSS("#transcript")))
	page, err := e.svc.BrowseSessions(ctx, service.SessionFilter{Agent: "notes", Key: "from-browser"})
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("the session the form created: %+v %v", page, err)
	}
	x := page.Sessions[0].Session
	waitText("#live-status", "live")

	// Send a signal from the form: the reply appears without a reload (a
	// mark set on this document survives).
	eval(`window.paddockMark = 42`)
	run("send a note", chromedp.SendKeys(chromedp.CSS("#signal-message"), "note <script>alert(1)</script>"),
		chromedp.Click(chromedp.CSS("#send")))
	waitText("#transcript", "noted (1)")
	run("send another", chromedp.SendKeys(chromedp.CSS("#signal-message"), "note <img src=x onerror=alert(1)>"),
		chromedp.Click(chromedp.CSS("#send")))
	waitText("#transcript", "noted (2)")
	run("list", chromedp.SendKeys(chromedp.CSS("#signal-message"), "list"), chromedp.Click(chromedp.CSS("#send")))
	live := waitText("#transcript", "2. <img src=x onerror=alert(1)>")
	if eval(`window.paddockMark || 0`) != 42 {
		t.Fatal("the page reloaded: the reply did not arrive live")
	}
	// Agent text is text: the markup shows as characters, makes no element.
	if !strings.Contains(live, "1. <script>alert(1)</script>") {
		t.Fatalf("the live transcript does not show the script as text: %q", live)
	}
	if elems := eval(`document.querySelectorAll('#transcript img, #transcript script').length`); elems != 0 {
		t.Fatalf("%d img/script elements in the transcript", elems)
	}
	shot("session-live")

	// The server-rendered page shows the same as text.
	run("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#transcript")))
	if s := text("#transcript"); !strings.Contains(s, "1. <script>alert(1)</script>") || !strings.Contains(s, "2. <img src=x onerror=alert(1)>") {
		t.Fatalf("the rendered transcript: %q", s)
	}
	if elems := eval(`document.querySelectorAll('#transcript img, #transcript script, #state img').length`); elems != 0 {
		t.Fatalf("%d img/script elements in the rendered page", elems)
	}
	ev.check(t)

	// A running turn's chunks show as they arrive, before its commit: an
	// observer set on the page records the text of the live turn.
	emitter := e.agent("emitter", wasmtest.CallGuest)
	ex := e.session(emitter, "")
	run("open the emitter's session", chromedp.Navigate(e.url+sessionPath(emitter, ex)), chromedp.WaitVisible(chromedp.CSS("#transcript")))
	waitText("#live-status", "live")
	eval(`window.paddockLive = ''; new MutationObserver(function () {
		document.querySelectorAll('#transcript .turn.live').forEach(function (e) { window.paddockLive += e.textContent + '|' })
	}).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true}); 0`)
	run("emit", chromedp.SendKeys(chromedp.CSS("#signal-message"), "emit 3"), chromedp.Click(chromedp.CSS("#send")))
	waitText("#transcript", "emit 3")
	seen, err := chromedp.Run(bctx, chromedp.Evaluate[string](`window.paddockLive`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(seen, "t0 t1 t2") || !strings.Contains(seen, `{"n":3}`) {
		t.Fatalf("the live turn never showed its chunks: %q", seen)
	}
	if n := eval(`document.querySelectorAll('#transcript .turn.live').length`); n != 0 {
		t.Fatalf("%d live turns left after the commit", n)
	}
	run("back to the notes session", chromedp.Navigate(e.url+sessionPath(notes, x)), chromedp.WaitVisible(chromedp.CSS("#transcript")))

	// Resolve a wait from its form.
	waitText("#live-status", "live")
	run("ask", chromedp.SendKeys(chromedp.CSS("#signal-message"), "ask what colour?"), chromedp.Click(chromedp.CSS("#send")))
	waitText("#transcript", "wait opened: ask-1")
	run("open the wait", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#wait-ask-1")))
	shot("session-wait")
	run("resolve", chromedp.SendKeys(chromedp.CSS("#wait-ask-1 .wait-data"), "blue"), chromedp.Click(chromedp.CSS("#wait-ask-1 .resolve")),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	waitText("#flash", "wait ask-1 resolved")
	if w, err := e.svc.GetWait(ctx, x, "ask-1"); err != nil || w.Status != store.WaitResolved {
		t.Fatalf("wait after the form: %+v %v", w, err)
	}
	waitText("#transcript", "blue")

	// An action without the right CSRF token is refused.
	eval(`document.querySelectorAll('input[name=csrf]').forEach(function (i) { i.value = 'forged' }); 0`)
	run("wake with a forged token", chromedp.Click(chromedp.CSS("#wake")), chromedp.WaitVisible(chromedp.CSS("#error")))
	if s := text("#error"); !strings.Contains(s, "CSRF") {
		t.Fatalf("a forged token: %q", s)
	}

	// Redrive the faulty agent's dead letter from the dead-letters page.
	run("dead letters", chromedp.Navigate(e.url+"/ui/dead-letters?agent=faulty"), chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
	shot("dead-letters")
	run("redrive", chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[name=ev][value="%s:%d"]`, f.SessionID, dl.ID))),
		chromedp.Click(chromedp.CSS("#redrive-selected")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	waitText("#flash", "redrive: 1 done")
	e.waitEvent(f, dl.ID, func(ev store.Event) bool { return ev.Redrives == 1 })

	// The other pages render.
	for _, p := range []struct{ path, sel, name string }{
		{"/ui/", "main", "overview"}, {"/ui/agents", "main table", "agents"}, {"/ui/sessions", "form.filters", "sessions"},
		{"/ui/modules", "main table", "modules"},
	} {
		run("open "+p.path, chromedp.Navigate(e.url+p.path), chromedp.WaitVisible(chromedp.CSS(p.sel)))
		shot(p.name)
	}

	// The nav bar's switcher takes the page to namespace a.
	run("switch to namespace a", chromedp.Navigate(e.url+"/ui/agents"), chromedp.WaitVisible(chromedp.CSS("#namespace-switch")),
		chromedp.SetValue(chromedp.CSS("#namespace-switch select"), "a"), chromedp.Click(chromedp.CSS("#namespace-switch button")),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/agents/anotes?namespace=a"]`)))
	if ns, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#namespace"))); err != nil || ns != "a" {
		t.Fatalf("the nav bar shows namespace %q (%v), want a", ns, err)
	}
	shot("namespace-a")

	// Destroy the session, through its confirmation.
	run("destroy", chromedp.Navigate(e.url+sessionPath(notes, x)), chromedp.WaitVisible(chromedp.CSS("#destroy")),
		chromedp.Click(chromedp.CSS("#destroy")), chromedp.WaitVisible(chromedp.CSS("#confirm-destroy")))
	shot("destroy")
	run("confirm", chromedp.Click(chromedp.CSS("#confirm-destroy")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	waitText("#status", "destroyed")
	if now, err := e.svc.GetSession(ctx, notes, x.SessionID); err != nil || now.Status != store.SessionDestroyed {
		t.Fatalf("session after the destroy form: %s %v", now.Status, err)
	}
	ev.check(t)
	t.Logf("screenshots in %s", shots)
}
