package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/paddock-dev/paddock/store"
)

type moduleJSON struct {
	Digest     string    `json:"digest"`
	Size       int64     `json:"size"`
	ABIVersion int       `json:"abi_version"`
	CreatedAt  time.Time `json:"created_at"`
	Created    *bool     `json:"created,omitempty"`
}

func toModuleJSON(m store.Module) moduleJSON {
	return moduleJSON{Digest: m.Digest, Size: m.Size, ABIVersion: m.ABIVersion, CreatedAt: m.CreatedAt}
}

// uploadModule takes the raw .wasm bytes (at most MaxModuleBytes): 201 when
// stored, 200 when that digest was stored already.
func (s *Server) uploadModule(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxModuleBytes))
	if err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("the module exceeds the limit of %d bytes (api.max_module_bytes)", s.o.MaxModuleBytes)}
		}
		return badRequest("unreadable_body", "", "reading the body: %v", err)
	}
	if len(body) == 0 {
		return badRequest("invalid_module", "", "the body is empty; send the raw .wasm bytes (Content-Type: application/wasm)")
	}
	m, created, err := s.svc.UploadModule(r.Context(), body)
	if err != nil {
		return err
	}
	out := toModuleJSON(m)
	out.Created = &created
	w.Header().Set("Location", "/v1/modules/"+m.Digest)
	return writeJSON(w, createdOr200(created), out)
}

// createdOr200 is 201 for a new resource, 200 for one that existed.
func createdOr200(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

func (s *Server) listModules(w http.ResponseWriter, r *http.Request) error {
	ms, err := s.svc.ListModules(r.Context())
	if err != nil {
		return err
	}
	out := make([]moduleJSON, 0, len(ms))
	for _, m := range ms {
		out = append(out, toModuleJSON(m))
	}
	return writeJSON(w, http.StatusOK, map[string]any{"modules": out})
}

func (s *Server) getModule(w http.ResponseWriter, r *http.Request) error {
	m, err := s.svc.GetModule(r.Context(), r.PathValue("digest"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toModuleJSON(m))
}
