package service

import "fmt"

// DefaultNamespace is the one namespace that exists today: every agent and
// session belongs to it (docs/DESIGN.md has no namespaces yet; a later
// change adds them and replaces CheckNamespace's rule).
const DefaultNamespace = "default"

// CheckNamespace refuses a namespace that does not exist: a *NotFoundError
// (ResourceNamespace, field "namespace") for any name but DefaultNamespace.
func (s *Service) CheckNamespace(name string) error {
	if name == DefaultNamespace {
		return nil
	}
	return &NotFoundError{Resource: ResourceNamespace, Field: "namespace",
		Message: fmt.Sprintf("no namespace %q (only %q exists)", name, DefaultNamespace)}
}
