package config

import (
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/store"
)

// Namespace declares a namespace besides "default" (docs/DESIGN.md
// "Namespaces"), with its quotas; "default" always exists and may be
// listed to give it quotas. Reloaded from the config file without a
// restart (host.Policy.Namespaces).
type Namespace struct {
	Quotas Quotas `koanf:"quotas"`
}

// Quotas bound what a namespace may use; 0 (the default) is unlimited.
type Quotas struct {
	// LiveSessions bounds the namespace's sessions that are not destroyed.
	LiveSessions int64 `koanf:"live_sessions"`
	// SignalsPerMinute bounds the signals accepted per minute, counted by
	// each host on its own.
	SignalsPerMinute int64 `koanf:"signals_per_minute"`
	// ModelTokensPerDay bounds the model tokens the namespace's agents use
	// per UTC day.
	ModelTokensPerDay int64 `koanf:"model_tokens_per_day"`
}

// HasNamespace reports whether ns exists under this configuration:
// "default", or a key of namespaces:.
func (c Config) HasNamespace(ns string) bool {
	if ns == store.DefaultNamespace {
		return true
	}
	_, ok := c.Namespaces[ns]
	return ok
}

// validateNamespaces checks namespaces: names and quotas.
func (c Config) validateNamespaces(bad func(key string, value any, reason string)) {
	for _, name := range sortedKeys(c.Namespaces) {
		key := "namespaces." + name
		if store.CheckNamespace(name) != nil {
			bad(key, name, "a namespace name must be 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit")
		}
		q := c.Namespaces[name].Quotas
		for f, v := range map[string]int64{"live_sessions": q.LiveSessions, "signals_per_minute": q.SignalsPerMinute,
			"model_tokens_per_day": q.ModelTokensPerDay} {
			if v < 0 {
				bad(key+".quotas."+f, v, "must not be negative (0: unlimited)")
			}
		}
	}
}

// checkQualified checks a name of the config that may name an object of
// another namespace than the default, "namespace/name"
// (store.QualifiedName): the namespace must be declared under namespaces:
// and the name must pass ok. It returns the reason it is refused, or "".
func (c Config) checkQualified(q string, ok func(string) bool, rule string) string {
	ns, name := store.SplitQualified(q)
	switch {
	case strings.Count(q, "/") > 1 || !ok(name):
		return "must be a name matching " + rule + ", or namespace/name for a declared namespace"
	case ns == store.DefaultNamespace && q != name:
		// One spelling per object: "default/x" would be a second key for
		// x, and the runtime looks x up by its plain name.
		return fmt.Sprintf("spells the default namespace out: write %q (a plain name is in the default namespace)", name)
	case !c.HasNamespace(ns):
		return fmt.Sprintf("names namespace %q, which is not declared under namespaces:", ns)
	}
	return ""
}
