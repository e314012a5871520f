package api

import (
	"net/http"
	"strconv"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func toToken(t store.Token) client.Token {
	return client.Token{ID: t.ID, Namespace: t.Namespace, Role: t.Role, Name: t.Name,
		CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, RevokedAt: t.RevokedAt}
}

// createToken creates a token: 201 with its value, answered this once.
func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var in client.CreateTokenRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	t, err := s.svc.CreateToken(r.Context(), service.CreateTokenParams{Namespace: in.Namespace, Role: in.Role, Name: in.Name})
	if err != nil {
		return err
	}
	auditAs(w, "", t.Namespace) // recorded in the namespace it is a token of
	w.Header().Set("Location", "/v1/tokens/"+t.ID)
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusCreated, client.NewToken{Token: toToken(t.Token), Value: t.Value})
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.svc.ListTokens(r.Context())
	if err != nil {
		return err
	}
	out := client.TokenList{Tokens: make([]client.Token, 0, len(ts))}
	for _, t := range ts {
		out.Tokens = append(out.Tokens, toToken(t))
	}
	return writeJSON(w, http.StatusOK, out)
}

// revokeToken revokes a token: 200 with it (its revoked_at).
func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	t, err := s.svc.RevokeToken(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toToken(t))
}

// listAudit answers a page of the audit log (?before=&limit=).
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	var p service.AuditPage
	q := r.URL.Query()
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return badRequest("invalid_parameter", "before", "before=%q must be an audit row id", v)
		}
		p.Before = n
	}
	// limit=0 is refused as on every list route (the service reads 0 as
	// its default page size).
	limit, err := intParam(r, "limit", store.DefaultAuditLimit, 1, store.MaxAuditLimit)
	if err != nil {
		return err
	}
	p.Limit = limit
	rows, next, err := s.svc.ListAudit(r.Context(), p)
	if err != nil {
		return asParam(err)
	}
	out := client.AuditPage{Entries: make([]client.AuditEntry, 0, len(rows)), NextBefore: next}
	for _, e := range rows {
		out.Entries = append(out.Entries, client.AuditEntry(e))
	}
	return writeJSON(w, http.StatusOK, out)
}
