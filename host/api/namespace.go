package api

import (
	"net/http"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
)

// namespace is the middleware that refuses a /v1 query parameter given
// more than once (400 invalid_parameter naming it) and reads the namespace a /v1 request
// acts in, ?namespace= (docs/DESIGN.md "Namespaces"; none: the caller's
// token's, else "default"), and hands it to the service
// (service.WithNamespace), which refuses one that does not exist and scopes
// every lookup to it. A malformed name is 400 invalid_parameter (field
// "namespace"); an undeclared one 404 namespace_not_found — except for a
// token of another namespace, which its route's Authorize refuses (403)
// whether the named one exists or not. Both are
// answered before any handler runs, so nothing is read or written.
func (s *Server) namespace(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		q := r.URL.Query()
		// No /v1 parameter takes several values: one given twice would be
		// read as its first and the other dropped silently. (Of several,
		// the first by name is reported; no allocation on every request.)
		dup := ""
		for name, vs := range q {
			if len(vs) > 1 && (dup == "" || name < dup) {
				dup = name
			}
		}
		if dup != "" {
			s.writeError(w, r, badRequest("invalid_parameter", dup, "%s is given %d times; give it once", dup, len(q[dup])))
			return
		}
		if _, named := q["namespace"]; !named {
			next.ServeHTTP(w, r)
			return
		}
		vs := q["namespace"]
		ns := vs[0]
		if c, ok := service.CallerFrom(r.Context()); ok && c.Namespace != "" && c.Namespace != ns {
			// Not the token's namespace: the route's Authorize answers 403
			// whether or not ns exists, so a token learns nothing of
			// other namespaces (not even their names).
			next.ServeHTTP(w, r.WithContext(service.WithNamespace(r.Context(), ns)))
			return
		}
		if err := s.svc.CheckNamespace(ns); err != nil {
			s.writeError(w, r, asParam(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(service.WithNamespace(r.Context(), ns)))
	})
}
