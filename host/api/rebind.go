package api

import (
	"net"
	"net/http"
	"strings"
)

// LoopbackHostOnly guards a server that listens on a loopback address
// without a token (the default `make run`): it answers 403 to a request
// whose Host header does not name a loopback address (localhost,
// 127.0.0.0/8, ::1). A web page on another site can point its own name at
// 127.0.0.1 (DNS rebinding) and then call this server as its own origin;
// its requests carry that name as Host, so they are refused here, before
// the API, the console or any other front door sees them.
func LoopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !LoopbackHost(r.Host) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":"forbidden_host","message":"this server listens on loopback without a token and answers only requests addressed to localhost, 127.0.0.1 or [::1]"}}` + "\n"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LoopbackHost reports whether host (a Host header: name or address, with
// an optional port) names the loopback interface.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
