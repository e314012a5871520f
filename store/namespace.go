package store

import (
	"fmt"
	"regexp"
	"strings"
)

// Namespaces (docs/DESIGN.md "Namespaces"): every agent, plugin worker,
// secret and module binding belongs to one; a session belongs to its
// agent's. Names are unique per namespace, and the store's reads that look
// a name up take the namespace it is looked up in.

// DefaultNamespace is the namespace of everything created without one
// (and of every row that existed before namespaces).
const DefaultNamespace = "default"

// AnyNamespace, passed where a read takes a namespace, reads across every
// namespace: the runtime's own reads (a turn's agent by uid, the plugin
// workers a host starts, the module a turn runs). Front doors always pass
// the namespace a request acts in.
const AnyNamespace = ""

// namespaceRE is the namespace name rule: the agent name rule.
var namespaceRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// CheckNamespace validates a namespace's name: 1 to 63 of lowercase
// letters, digits, '_' and '-', starting with a letter or digit. The error
// names it and wraps ErrInvalid.
func CheckNamespace(ns string) error {
	if !namespaceRE.MatchString(ns) {
		return fmt.Errorf("namespace %q must match %s: %w", ns, namespaceRE, ErrInvalid)
	}
	return nil
}

// NamespaceOr returns ns, or DefaultNamespace when ns is empty: what a
// write does with a namespace left unset.
func NamespaceOr(ns string) string {
	if ns == "" {
		return DefaultNamespace
	}
	return ns
}

// QualifiedName is how one name of a namespace is spelled where names of
// every namespace share one space (the config's agents: and secrets: keys,
// a secret's sealing additional data): the name itself in the default
// namespace (so what existed before namespaces keeps its spelling), else
// "namespace/name". Names never hold '/', so the spelling is unambiguous.
func QualifiedName(ns, name string) string {
	if ns == "" || ns == DefaultNamespace {
		return name
	}
	return ns + "/" + name
}

// SplitQualified is QualifiedName's inverse: "team/chat" is ("team",
// "chat"), "chat" is (DefaultNamespace, "chat").
func SplitQualified(q string) (ns, name string) {
	if ns, name, ok := strings.Cut(q, "/"); ok {
		return ns, name
	}
	return DefaultNamespace, q
}
