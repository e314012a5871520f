package service

import (
	"context"
	"fmt"
	"slices"

	"github.com/paddock-dev/paddock/store"
)

// DefaultNamespace is the namespace every request acts in when it names
// none (docs/DESIGN.md "Namespaces"); it always exists.
const DefaultNamespace = store.DefaultNamespace

// CheckNamespace refuses a namespace that does not exist: a *NotFoundError
// (ResourceNamespace, field "namespace") for any name but DefaultNamespace
// and the namespaces the host's config declares (host.Policy.Namespaces,
// hot-reloaded), and an *InvalidError (field "namespace") for a name that
// breaks the name rule (store.CheckNamespace).
func (s *Service) CheckNamespace(name string) error {
	if name == DefaultNamespace {
		return nil
	}
	if store.CheckNamespace(name) != nil {
		return invalid("namespace", "namespace %q must be 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit", name)
	}
	if _, ok := s.h.Policy().Namespaces[name]; ok {
		return nil
	}
	return &NotFoundError{Resource: ResourceNamespace, Field: "namespace",
		Message: fmt.Sprintf("no namespace %q (declare it in the host's config: namespaces:)", name)}
}

// namespace returns the namespace the operations of ctx act in
// (NamespaceOf), refused by CheckNamespace when it does not exist. Every
// operation that looks a name up, lists or creates starts with it, so an
// object of another namespace is never found: it is answered as a missing
// one (no existence leak), whatever id the request copied.
func (s *Service) namespace(ctx context.Context) (string, error) {
	ns := NamespaceOf(ctx)
	if err := s.CheckNamespace(ns); err != nil {
		return "", err
	}
	return ns, nil
}

// Namespaces returns the namespaces ctx's caller may act in, for a front
// door's namespace switcher: a token of one namespace, only its own; a
// caller of every namespace (the bootstrap admin, the anonymous caller of
// an open host, the host itself), DefaultNamespace first and then the
// namespaces the host's config declares (host.Policy.Namespaces,
// hot-reloaded), sorted.
func (s *Service) Namespaces(ctx context.Context) []string {
	if c := callerOf(ctx); c.Namespace != "" {
		return []string{c.Namespace}
	}
	declared := s.h.Policy().Namespaces
	out := make([]string, 0, 1+len(declared))
	for name := range declared {
		if name != DefaultNamespace {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return append([]string{DefaultNamespace}, out...)
}
