package api

import (
	"errors"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// maxSecretBody bounds the body of PUT /v1/secrets/{name}: a value of
// service.MaxSecretBytes escaped as JSON (at most 6 bytes per byte,
// "\u00XX") and the object around it, whatever api.max_body_bytes allows.
const maxSecretBody = 6*service.MaxSecretBytes + 1024

func toSecret(s store.Secret) client.Secret {
	return client.Secret{Name: s.Name, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// putSecret sets a secret: 201 created, 200 replaced. The value is never
// answered, logged or put in an error: the body is decoded here and
// handed to the service, which seals it; a refused body's error names the
// problem, not the value.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var in client.PutSecretRequest
	if err := s.decodeLimit(w, r, &in, max(s.o.MaxBodyBytes, maxSecretBody)); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == "malformed_json" {
			// A JSON error quotes the body's bytes: not this body's.
			return badRequest("malformed_json", "", "the body must be one JSON object {\"value\": \"...\"} (the body is not quoted: it holds a secret)")
		}
		return err
	}
	sec, created, err := s.svc.PutSecret(r.Context(), name, []byte(in.Value))
	in.Value = ""
	var tooLarge *service.TooLargeError
	if errors.As(err, &tooLarge) {
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "secret_too_large", Field: tooLarge.Field, Message: tooLarge.Message}
	}
	if err != nil {
		return asParamName(err)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/secrets/"+sec.Name)
	return writeJSON(w, status, toSecret(sec))
}

// asParamName answers a refused secret name, which is a path parameter,
// as invalid_parameter; a refused value stays invalid_field or
// missing_field of the body.
func asParamName(err error) error {
	var invalid *service.InvalidError
	if errors.As(err, &invalid) && invalid.Field == "name" {
		return asParam(err)
	}
	return err
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) error {
	secs, err := s.svc.ListSecrets(r.Context())
	if err != nil {
		return err
	}
	out := client.SecretList{Secrets: make([]client.Secret, 0, len(secs))}
	for _, sec := range secs {
		out.Secrets = append(out.Secrets, toSecret(sec))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeleteSecret(r.Context(), r.PathValue("name")); err != nil {
		return asParamName(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
