package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/service"
)

// CSRFCookie holds a browser's CSRF token (HttpOnly, SameSite=Strict); a
// console form posts the same value as CSRFField (double submit).
const (
	CSRFCookie = "paddock_csrf"
	CSRFField  = "csrf"
)

// caller returns the caller of r's console login (the anonymous admin on
// an open host), or an *service.UnauthenticatedError.
func (c *Console) caller(r *http.Request) (service.Caller, error) {
	var id string
	if ck, err := r.Cookie(api.SessionCookie); err == nil {
		id = ck.Value
	}
	return c.svc.ConsoleCaller(r.Context(), id)
}

// setCookie sets an HttpOnly, SameSite=Strict cookie for the whole site
// (the API's stream route reads the session cookie); Secure over TLS.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// csrfToken returns r's CSRF token, setting a new one when r has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(CSRFCookie); err == nil && len(ck.Value) >= 32 {
		return ck.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	v := base64.RawURLEncoding.EncodeToString(b)
	setCookie(w, r, CSRFCookie, v, 0)
	// A page rendered in the same response reads it from the request.
	r.AddCookie(&http.Cookie{Name: CSRFCookie, Value: v})
	return v
}

// checkCSRF refuses a POST whose form token does not equal its CSRF
// cookie, or that comes from another origin (the Origin header, when sent,
// must name the request's Host; Sec-Fetch-Site must not be cross-site or
// same-site).
func (c *Console) checkCSRF(r *http.Request) error {
	refused := &pageError{Status: http.StatusForbidden, Message: "refused: missing or wrong CSRF token (reload the page and try again)"}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return &pageError{Status: http.StatusForbidden, Message: "refused: the request comes from another origin"}
		}
	}
	// A browser names where a request comes from: only the console's own
	// origin (or the user, "none") may post, not a sibling subdomain.
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return &pageError{Status: http.StatusForbidden, Message: "refused: the request comes from another site"}
	}
	ck, err := r.Cookie(CSRFCookie)
	if err != nil || len(ck.Value) < 32 {
		return refused
	}
	r.Body = http.MaxBytesReader(nil, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		return &pageError{Status: http.StatusBadRequest, Message: "the form could not be read: " + err.Error()}
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get(CSRFField)), []byte(ck.Value)) != 1 {
		return refused
	}
	return nil
}

// loginPage shows the login form (or the overview when no token is
// configured or the browser is logged in).
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, err := c.caller(r); err == nil {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.renderLogin(w, r, http.StatusOK, "")
}

func (c *Console) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if err := c.render(w, r, status, "login", "Log in", "", struct{ Next, Error string }{safeNext(r.FormValue("next")), msg}); err != nil {
		c.fail(w, r, err)
	}
}

// login checks the token posted by the login form (the auth_token or a
// stored token) and sets the login cookie (the id of a console login,
// never the token itself).
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := c.checkCSRF(r); err != nil {
		c.fail(w, r, err)
		return
	}
	if c.svc.Open() {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	id, _, err := c.svc.ConsoleLogin(r.Context(), r.PostForm.Get("token"))
	var un *service.UnauthenticatedError
	if errors.As(err, &un) {
		c.renderLogin(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	setCookie(w, r, api.SessionCookie, id, 0)
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

// logout clears the session cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if err := c.checkCSRF(r); err != nil {
		c.fail(w, r, err)
		return
	}
	if ck, err := r.Cookie(api.SessionCookie); err == nil {
		c.svc.ConsoleLogout(ck.Value)
	}
	setCookie(w, r, api.SessionCookie, "", -1)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// safeNext keeps a redirect target inside the console (no open redirect).
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}
