package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
)

func toModule(m store.Module) client.Module {
	return client.Module{Digest: m.Digest, Size: m.Size, ABIVersion: m.ABIVersion, CreatedAt: m.CreatedAt}
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
	out := toModule(m)
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
	out := client.ModuleList{Modules: make([]client.Module, 0, len(ms))}
	for _, m := range ms {
		out.Modules = append(out.Modules, toModule(m))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getModule(w http.ResponseWriter, r *http.Request) error {
	m, err := s.svc.GetModule(r.Context(), r.PathValue("digest"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toModule(m))
}
