package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
)

// SessionCookie is the cookie the web console (host/console) keeps a
// logged-in browser's session in: HttpOnly, SameSite=Strict, Path=/. Its
// value is SessionValue(auth token), never the token itself.
const SessionCookie = "paddock_session"

// SessionValue is the value of SessionCookie for the auth token: an HMAC
// of a fixed label under the token, so the browser never holds the token
// and a changed token ends every console session.
func SessionValue(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("paddock console session v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// ValidSession reports whether r carries the console's session cookie for
// token (compared in constant time).
func ValidSession(r *http.Request, token string) bool {
	c, err := r.Cookie(SessionCookie)
	if err != nil || token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(c.Value), []byte(SessionValue(token))) == 1
}
