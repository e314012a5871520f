// Package console is Paddock's web console at /ui/ (docs/DESIGN.md "The web
// console"): server-rendered html/template pages over host/service — the
// same operations and rules as the HTTP API — with plain HTML forms for
// actions and one small script (assets/live.js) that follows a session's
// stream (the API's SSE route) to make its transcript live.
//
// Everything it serves is embedded (go:embed): no Node toolchain, no CDN.
// Security:
//   - Auth: when an auth token is configured, every page needs the
//     login cookie (api.SessionCookie, HttpOnly, SameSite=Strict) set by
//     the login form, which takes the auth_token or a stored token; the
//     cookie holds the id of a login kept in the host's memory
//     (service.ConsoleLogin), never a token. Pages need a reader, each
//     action its op's role (service.OpRules; 403 page otherwise, nothing
//     written), and each action is audited. Without a token the console
//     is open like the API.
//   - CSRF: every POST carries a token equal to the HttpOnly csrf cookie
//     (double submit), and a cross-site Origin is refused; a refused POST
//     writes nothing (403).
//   - CSP: default-src 'none'; scripts, styles and connections from the
//     console's own origin only, no inline script or style, no framing.
//   - Every text from an agent or a client is escaped by html/template
//     and inserted by live.js as text (textContent), never as HTML.
package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of every console response.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Options configure the console.
type Options struct {
	// Service is the runtime the console calls (required).
	Service *service.Service
	// AuthToken, when set, is the bootstrap admin token: New gives it to
	// the service (Service.WithAuthToken). The login form then takes it or
	// any stored token, and each page and action needs the token's role
	// (service.OpRules: pages are reads, each action its op).
	AuthToken string
	// Logger logs internal errors (nil: slog.Default()).
	Logger *slog.Logger
}

// Console serves the web console under Prefix.
type Console struct {
	o     Options
	svc   *service.Service
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
}

// New builds the console. It fails only if an embedded template does not
// parse (a build defect).
func New(o Options) (*Console, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.AuthToken != "" {
		o.Service.WithAuthToken(o.AuthToken)
	}
	c := &Console{o: o, svc: o.Service, log: o.Logger, pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	names, err := fs.Glob(assets, "assets/templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		base := path.Base(n)
		if base == "layout.html" {
			continue
		}
		t, err := template.New(base).Funcs(funcs()).ParseFS(assets, "assets/templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", base, err)
		}
		c.pages[strings.TrimSuffix(base, ".html")] = t
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	files := http.StripPrefix("/ui/static/", http.FileServerFS(static))
	c.mux.HandleFunc("GET /ui/static/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // no directory listings
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	c.mux.HandleFunc("GET /ui/login", c.loginPage)
	c.mux.HandleFunc("POST /ui/login", c.login)
	c.mux.HandleFunc("POST /ui/logout", c.logout)
	c.handle("GET /ui/{$}", read, c.overview)
	c.handle("GET /ui/agents", read, c.agents)
	c.handle("GET /ui/agents/{agent}", read, c.agent)
	c.handle("POST /ui/agents/{agent}/sessions", op(service.OpSessionCreate), c.createSession)
	c.handle("GET /ui/sessions", read, c.sessions)
	c.handle("GET /ui/agents/{agent}/sessions/{session}", read, c.session)
	c.handle("GET /ui/agents/{agent}/sessions/{session}/events/{event}", read, c.event)
	// A signal's kind is authorized by the service (SignalOp).
	c.handle("POST /ui/agents/{agent}/sessions/{session}/signal", op(service.OpSignalSend), c.signal)
	c.handle("GET /ui/agents/{agent}/sessions/{session}/destroy", read, c.destroyPage)
	c.handle("POST /ui/agents/{agent}/sessions/{session}/destroy", op(service.OpSessionDestroy), c.destroy)
	c.handle("POST /ui/agents/{agent}/sessions/{session}/waits/{wait}", op(service.OpWaitResolve), c.resolveWait)
	c.handle("GET /ui/dead-letters", read, c.deadLetters)
	c.handle("POST /ui/agents/{agent}/dead-letters", deadLetterOp, c.deadLetterAction)
	c.handle("GET /ui/modules", read, c.modules)
	c.handle("/ui/", read, func(http.ResponseWriter, *http.Request) error {
		return &pageError{Status: http.StatusNotFound, Message: "no such page"}
	})
	return c, nil
}

// Handler returns the console and the API (api) behind one handler: /ui/
// is the console, / redirects to it, everything else is api's.
func (c *Console) Handler(api http.Handler) http.Handler {
	m := http.NewServeMux()
	m.Handle("/", api)
	m.Handle(Prefix, c)
	m.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
	return m
}

// ServeHTTP sets the security headers and routes a console request.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

// read is the op of every console page.
func read(*http.Request) service.Op { return service.OpConsoleRead }

// op returns a route's fixed op.
func op(o service.Op) func(*http.Request) service.Op {
	return func(*http.Request) service.Op { return o }
}

// deadLetterOp is the op of a dead-letter action (its form's op, read
// after checkCSRF parsed the form).
func deadLetterOp(r *http.Request) service.Op {
	if strings.HasPrefix(r.PostForm.Get("op"), "discard") {
		return service.OpEventDiscard
	}
	return service.OpEventRedrive
}

// handle registers a page or action: it needs a logged-in browser (when
// the host has a token), and, for a POST, a valid CSRF token; the
// caller's role must allow the route's op (a 403 page otherwise, before
// anything is written). An action of a mutating op appends one audit row.
func (c *Console) handle(pattern string, opOf func(*http.Request) service.Op, f func(http.ResponseWriter, *http.Request) error) {
	c.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		caller, err := c.caller(r)
		if err != nil {
			var un *service.UnauthenticatedError
			switch {
			case !errors.As(err, &un):
				c.fail(w, r, err)
			case r.Method != http.MethodGet:
				c.fail(w, r, &pageError{Status: http.StatusUnauthorized, Message: "log in first"})
			default:
				http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			}
			return
		}
		r = r.WithContext(service.WithCaller(r.Context(), caller))
		if r.Method == http.MethodPost {
			if err := c.checkCSRF(r); err != nil {
				c.fail(w, r, err)
				return
			}
		}
		// A refusal is answered in the caller's own namespace (r), not
		// in the one it named (nr).
		nr, err := c.inNamespace(r, caller)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		o := opOf(nr)
		if err := c.svc.Authorize(nr.Context(), o); err != nil {
			c.fail(w, r, err)
			return
		}
		r = nr
		err = f(w, r)
		if rule, _ := o.Rule(); rule.Mutates {
			c.audit(r, o, err)
		}
		if err != nil {
			c.fail(w, r, err)
		}
	})
}

// NamespaceParam is the query parameter (and, in a form, the field) that
// names the namespace a console page or action acts in, like the API's
// ?namespace= (docs/DESIGN.md "Namespaces"). Every link and form of a page
// carries the namespace the page acts in.
const NamespaceParam = "namespace"

// inNamespace returns r acting in the namespace it names (NamespaceParam:
// the query of a page, the form or the query of an action), validated like
// the API's: given twice with different values or malformed, 400; not
// declared, 404 — except for a token of another namespace, which the
// route's Authorize refuses (403) whether or not the named one exists, so
// a token learns nothing of other namespaces. None named: r as it is (the
// caller's token's namespace, else default).
func (c *Console) inNamespace(r *http.Request, caller service.Caller) (*http.Request, error) {
	vs := r.URL.Query()[NamespaceParam]
	if r.Method == http.MethodPost {
		vs = r.Form[NamespaceParam] // the form's, then the query's (checkCSRF parsed both)
	}
	if len(vs) == 0 {
		return r, nil
	}
	ns := vs[0]
	for _, v := range vs[1:] {
		if v != ns {
			return nil, &pageError{Status: http.StatusBadRequest, Message: fmt.Sprintf("namespace is given %d times with different values; give it once", len(vs))}
		}
	}
	if caller.Namespace == "" || caller.Namespace == ns {
		if err := c.svc.CheckNamespace(ns); err != nil {
			return nil, err
		}
	}
	return r.WithContext(service.WithNamespace(r.Context(), ns)), nil
}

// inNS returns the console path p (which may have a query) naming the
// namespace ctx acts in.
func inNS(ctx context.Context, p string) string {
	sep := "?"
	if strings.Contains(p, "?") {
		sep = "&"
	}
	return p + sep + NamespaceParam + "=" + url.QueryEscape(service.NamespaceOf(ctx))
}

// navPaths are the list pages of the navigation entries: the namespace
// switcher of a page goes to its entry's list in the namespace chosen.
var navPaths = map[string]string{
	"overview": "/ui/", "agents": "/ui/agents", "sessions": "/ui/sessions",
	"dead-letters": "/ui/dead-letters", "modules": "/ui/modules",
}

// audit appends the audit row of an action that ended with err (none
// for a refusal of the caller's role or namespace).
func (c *Console) audit(r *http.Request, o service.Op, err error) {
	result, status := "ok", http.StatusSeeOther
	if err != nil {
		status, _ = c.status(err)
		var denied *service.ForbiddenError
		if errors.As(err, &denied) {
			return
		}
		result = strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "_")
	}
	if aerr := c.svc.Audit(context.WithoutCancel(r.Context()), o, r.URL.Path, result, status); aerr != nil {
		c.log.Error("console: audit row not written", "op", o, "err", aerr)
	}
}

// page is what every template gets.
type page struct {
	Title string
	// Nav is the navigation entry to highlight.
	Nav string
	// CSRF is the token every form posts back.
	CSRF string
	// Auth: a token is configured (the nav shows "log out").
	Auth bool
	// Flash is a message from the action that redirected here.
	Flash string
	// NS is the namespace the page acts in (every link and form carries
	// it); Namespaces those the caller may switch to (service.Namespaces);
	// NavPath the list page the switcher goes to.
	NS         string
	Namespaces []string
	NavPath    string
	// Data is the page's own data.
	Data any
}

// render writes template name with data.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title, nav string, data any) error {
	t, ok := c.pages[name]
	if !ok {
		return fmt.Errorf("console: no template %q", name)
	}
	p := page{Title: title, Nav: nav, CSRF: c.csrfToken(w, r), Auth: !c.svc.Open(), Flash: takeFlash(w, r), Data: data,
		NS: service.NamespaceOf(r.Context()), NavPath: navPaths[nav]}
	if nav != "" {
		p.Namespaces = c.svc.Namespaces(r.Context())
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		return fmt.Errorf("console: render %s: %w", name, err)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	return nil
}

// pageError is an error answered with its status and message.
type pageError struct {
	Status  int
	Message string
}

func (e *pageError) Error() string { return e.Message }

// status returns the status and message err is answered with: the
// service's typed errors with theirs, anything else 500 (known false: its
// detail is only logged).
func (c *Console) status(err error) (status int, msg string) {
	var pe *pageError
	var inv *service.InvalidError
	var nf *service.NotFoundError
	var cf *service.ConflictError
	var gone *service.GoneError
	var tl *service.TooLargeError
	var denied *service.ForbiddenError
	var un *service.UnauthenticatedError
	switch {
	case errors.As(err, &pe):
		return pe.Status, pe.Message
	case errors.As(err, &denied):
		return http.StatusForbidden, "refused: " + denied.Message
	case errors.As(err, &un):
		return http.StatusUnauthorized, un.Message
	case errors.As(err, &inv):
		return http.StatusBadRequest, inv.Error()
	case errors.As(err, &tl):
		return http.StatusRequestEntityTooLarge, tl.Error()
	case errors.As(err, &nf):
		return http.StatusNotFound, nf.Error()
	case errors.As(err, &cf):
		return http.StatusConflict, cf.Error()
	case errors.As(err, &gone):
		return http.StatusGone, gone.Error()
	case errors.Is(err, store.ErrSessionDestroyed):
		return http.StatusConflict, "the session is destroyed"
	}
	return http.StatusInternalServerError, ""
}

// fail answers err as an error page: the service's typed errors with their
// status and message, anything else as a 500 whose detail is only logged.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := c.status(err)
	if msg == "" {
		msg = "internal error (see the host's log)"
		c.log.Error("console: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if rerr := c.render(w, r, status, "error", http.StatusText(status), "", struct {
		Status  int
		Message string
	}{status, msg}); rerr != nil {
		http.Error(w, msg, status)
	}
}

// FlashCookie carries the message of an action to the page it redirects
// to (read once): a cookie, not the URL, so that a link cannot make the
// console show someone's text.
const FlashCookie = "paddock_flash"

// maxFlash bounds a flash message, in bytes.
const maxFlash = 1000

// redirect answers an action with 303 to to, carrying a flash message.
func redirect(w http.ResponseWriter, r *http.Request, to, flash string) {
	if flash != "" {
		if len(flash) > maxFlash {
			flash = flash[:maxFlash] + "…"
		}
		setCookie(w, r, FlashCookie, url.QueryEscape(flash), 60)
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// takeFlash returns the flash message r carries and clears it.
func takeFlash(w http.ResponseWriter, r *http.Request) string {
	ck, err := r.Cookie(FlashCookie)
	if err != nil {
		return ""
	}
	setCookie(w, r, FlashCookie, "", -1)
	msg, err := url.QueryUnescape(ck.Value)
	if err != nil {
		return ""
	}
	return msg
}

// sessionURL is the console path of a session's page.
func sessionURL(agent, id string) string {
	return "/ui/agents/" + url.PathEscape(agent) + "/sessions/" + url.PathEscape(id)
}

// funcs returns the templates' helpers.
func funcs() template.FuncMap {
	return template.FuncMap{
		"sessionURL": sessionURL,
		// rows hands the sessionrows template its rows and the namespace
		// its links carry.
		"rows": func(ns string, rows []service.SessionRow) any {
			return struct {
				NS   string
				Rows []service.SessionRow
			}{ns, rows}
		},
		"agentURL": func(name string) string { return "/ui/agents/" + url.PathEscape(name) },
		"streamURL": func(agent, id string) string {
			return "/v1/agents/" + url.PathEscape(agent) + "/sessions/" + url.PathEscape(id) + "/stream"
		},
		"time": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				if v.IsZero() {
					return ""
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			case *time.Time:
				if v == nil {
					return ""
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			}
			return fmt.Sprint(t)
		},
		"short": func(s string) string {
			if len(s) > 19 {
				return s[:19] + "…"
			}
			return s
		},
		"payload": payloadText,
		// dur renders a duration to the millisecond; neg negates one.
		"dur": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
		"neg": func(d time.Duration) time.Duration { return -d },
		"bytes": func(n int64) string {
			switch {
			case n >= 1<<20:
				return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
			case n >= 1<<10:
				return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
			}
			return fmt.Sprintf("%d B", n)
		},
	}
}
