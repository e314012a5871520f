package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Namespaces (docs/DESIGN.md "Namespaces"): names are unique per
// namespace, and nothing of one namespace is listed or read from another.
func namespaceCases() []testCase {
	return []testCase{
		{"Namespaces/SameNamesCoexist", testNamespacesSameNames},
		{"Namespaces/NothingReadAcross", testNamespacesNothingAcross},
		{"Namespaces/BindingNeedsVisibility", testNamespacesBinding},
		{"Namespaces/InvalidIsRefused", testNamespacesInvalid},
		{"Namespaces/QuotaReadsCountTheirNamespace", testNamespacesQuotaReads},
	}
}

// nsModule uploads content to namespace ns.
func (b *bundle) nsModule(ns, content string) (store.Module, bool) {
	b.t.Helper()
	data := []byte("\x00asm\x01\x00\x00\x00" + content)
	m, created, err := b.s.PutModule(b.ctx, store.PutModuleParams{Namespace: ns, Digest: digest(data), ABIVersion: abi.Version, Bytes: data})
	noErr(b.t, err, "PutModule in "+ns)
	return m, created
}

func testNamespacesSameNames(t *testing.T, b *bundle) {
	// The bundle's agent is in the default namespace; the same name, a
	// plugin worker and a secret of the same names live in "team-b".
	wantEq(t, b.agent.Namespace, store.DefaultNamespace, "an agent created without a namespace")
	m, created := b.nsModule("team-b", "agent module")
	wantEq(t, created, true, "the default namespace's module uploaded to team-b is new there")
	wantEq(t, m.Namespace, "team-b", "module namespace")
	other, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-b",
		Name: b.agent.Name, ModuleDigest: m.Digest, CrashPolicy: store.CrashSleep})
	noErr(t, err, "CreateAgent of a taken name in another namespace")
	wantEq(t, other.Namespace, "team-b", "agent namespace")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-b",
		Name: b.agent.Name, ModuleDigest: m.Digest, CrashPolicy: store.CrashSleep})
	wantIs(t, err, store.ErrConflict, "the same name twice in team-b")

	for _, ns := range []string{store.DefaultNamespace, "team-b"} {
		w, created, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{Namespace: ns, Name: "tool",
			Path: "/opt/" + ns, SHA256: sha256A, Processes: 1})
		noErr(t, err, "PutPluginWorker in "+ns)
		wantEq(t, created, true, "plugin worker tool created in "+ns)
		wantEq(t, w.Namespace, ns, "plugin worker namespace")
		sec, created, err := b.s.PutSecret(b.ctx, ns, "KEY", []byte("sealed-"+ns))
		noErr(t, err, "PutSecret in "+ns)
		wantEq(t, created, true, "secret KEY created in "+ns)
		wantEq(t, sec.Namespace, ns, "secret namespace")
	}
	for _, ns := range []string{store.DefaultNamespace, "team-b"} {
		w, err := b.s.GetPluginWorker(b.ctx, ns, "tool")
		noErr(t, err, "GetPluginWorker in "+ns)
		wantEq(t, w.Path, "/opt/"+ns, "the plugin worker of "+ns)
		sealed, err := b.s.SealedSecret(b.ctx, ns, "KEY")
		noErr(t, err, "SealedSecret in "+ns)
		wantBytes(t, sealed, []byte("sealed-"+ns), "the secret of "+ns)
		a, err := b.s.GetAgent(b.ctx, ns, b.agent.Name)
		noErr(t, err, "GetAgent by name in "+ns)
		wantEq(t, a.Namespace, ns, "GetAgent's namespace")
	}
	// A plugin agent of team-b binds team-b's plugin worker, whose
	// checksum the binding reads.
	pa, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-b",
		Name: "tooled", Kind: store.KindPlugin, Plugin: "tool", CrashPolicy: store.CrashRestart})
	noErr(t, err, "plugin agent in team-b")
	wantEq(t, pa.Plugin, "tool", "plugin agent binding")

	// Each list holds its own namespace's.
	all, err := b.s.ListAgents(b.ctx, store.AnyNamespace)
	noErr(t, err, "ListAgents of every namespace")
	wantEq(t, len(all), 3, "agents of every namespace")
	ws, err := b.s.ListPluginWorkers(b.ctx, store.AnyNamespace)
	noErr(t, err, "ListPluginWorkers of every namespace")
	wantEq(t, len(ws), 2, "plugin workers of every namespace")
	secs, err := b.s.ListSecrets(b.ctx, store.AnyNamespace)
	noErr(t, err, "ListSecrets of every namespace")
	wantEq(t, len(secs), 2, "secrets of every namespace")

	// Deleting one namespace's secret leaves the other's.
	noErr(t, b.s.DeleteSecret(b.ctx, "team-b", "KEY"), "DeleteSecret in team-b")
	_, err = b.s.SealedSecret(b.ctx, "team-b", "KEY")
	wantIs(t, err, store.ErrNotFound, "the deleted secret")
	_, err = b.s.SealedSecret(b.ctx, store.DefaultNamespace, "KEY")
	noErr(t, err, "the default namespace's secret after team-b's was deleted")
}

func testNamespacesNothingAcross(t *testing.T, b *bundle) {
	m, _ := b.nsModule("team-a", "only in team-a")
	a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-a",
		Name: "secretive", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	noErr(t, err, "CreateAgent in team-a")
	key := b.sessionOf(a.UID, store.CrashRestart)
	_, _, err = b.s.PutPluginWorker(b.ctx, store.PluginWorker{Namespace: "team-a", Name: "tool", Path: "/p", SHA256: sha256A, Processes: 1})
	noErr(t, err, "PutPluginWorker in team-a")
	_, _, err = b.s.PutSecret(b.ctx, "team-a", "TOKEN", []byte("sealed"))
	noErr(t, err, "PutSecret in team-a")

	const other = "team-b"
	for _, ref := range []string{a.Name, a.UID} {
		_, err = b.s.GetAgent(b.ctx, other, ref)
		wantIs(t, err, store.ErrNotFound, fmt.Sprintf("GetAgent(%s) of team-a from team-b", ref))
		_, err = b.s.GetAgent(b.ctx, store.DefaultNamespace, ref)
		wantIs(t, err, store.ErrNotFound, fmt.Sprintf("GetAgent(%s) of team-a from default", ref))
	}
	got, err := b.s.GetAgent(b.ctx, store.AnyNamespace, a.UID)
	noErr(t, err, "GetAgent by uid across namespaces (the runtime's read)")
	wantEq(t, got.Namespace, "team-a", "the runtime's read of the agent")
	_, err = b.s.GetAgent(b.ctx, store.AnyNamespace, a.Name)
	wantIs(t, err, store.ErrNotFound, "GetAgent by name across namespaces (uid only)")

	_, err = b.s.GetModule(b.ctx, other, m.Digest)
	wantIs(t, err, store.ErrNotFound, "GetModule of team-a's module from team-b")
	rm, err := b.s.GetModule(b.ctx, store.AnyNamespace, m.Digest)
	noErr(t, err, "GetModule by digest across namespaces (the runtime's read)")
	wantEq(t, len(rm.Bytes) > 0, true, "the runtime's read has the bytes")
	_, err = b.s.GetPluginWorker(b.ctx, other, "tool")
	wantIs(t, err, store.ErrNotFound, "GetPluginWorker of team-a from team-b")
	_, err = b.s.SealedSecret(b.ctx, other, "TOKEN")
	wantIs(t, err, store.ErrNotFound, "SealedSecret of team-a from team-b")
	wantIs(t, b.s.DeleteSecret(b.ctx, other, "TOKEN"), store.ErrNotFound, "DeleteSecret of team-a from team-b")
	_, err = b.s.SealedSecret(b.ctx, "team-a", "TOKEN")
	noErr(t, err, "team-a's secret after team-b's delete")

	as, err := b.s.ListAgents(b.ctx, other)
	noErr(t, err, "ListAgents of team-b")
	wantEq(t, len(as), 0, "agents listed in team-b")
	as, err = b.s.ListAgents(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListAgents of default")
	wantEq(t, len(as), 1, "agents listed in default (the bundle's)")
	ms, err := b.s.ListModules(b.ctx, other)
	noErr(t, err, "ListModules of team-b")
	wantEq(t, len(ms), 0, "modules listed in team-b")
	ms, err = b.s.ListModules(b.ctx, "team-a")
	noErr(t, err, "ListModules of team-a")
	wantEq(t, len(ms), 1, "modules listed in team-a")
	ws, err := b.s.ListPluginWorkers(b.ctx, other)
	noErr(t, err, "ListPluginWorkers of team-b")
	wantEq(t, len(ws), 0, "plugin workers listed in team-b")
	secs, err := b.s.ListSecrets(b.ctx, other)
	noErr(t, err, "ListSecrets of team-b")
	wantEq(t, len(secs), 0, "secrets listed in team-b")

	// Browsing sessions by namespace.
	b.session() // one of the default namespace's agent
	for ns, want := range map[string]int{"team-a": 1, other: 0, store.DefaultNamespace: 1} {
		page, err := b.s.BrowseSessions(b.ctx, store.BrowseSessionsParams{Namespace: ns, Limit: 10})
		noErr(t, err, "BrowseSessions of "+ns)
		wantEq(t, len(page.Sessions), want, "sessions browsed in "+ns)
		if ns == "team-a" {
			wantEq(t, page.Sessions[0].ActorKey, key, "team-a's session")
		}
	}
	page, err := b.s.BrowseSessions(b.ctx, store.BrowseSessionsParams{Limit: 10})
	noErr(t, err, "BrowseSessions of every namespace")
	wantEq(t, len(page.Sessions), 2, "sessions browsed across namespaces")
}

func testNamespacesBinding(t *testing.T, b *bundle) {
	// The default namespace's module is not visible in team-b: binding
	// it there is refused as unknown, until it is uploaded there too.
	m := b.module("agent module")
	p := store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-b", Name: "x", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart}
	_, err := b.s.CreateAgent(b.ctx, p)
	wantIs(t, err, store.ErrNotFound, "binding a module not visible in the agent's namespace")
	_, err = b.s.GetAgent(b.ctx, "team-b", "x")
	wantIs(t, err, store.ErrNotFound, "no agent was written")
	b.nsModule("team-b", "agent module")
	_, err = b.s.CreateAgent(b.ctx, p)
	noErr(t, err, "binding once uploaded to team-b")

	_, _, err = b.s.PutPluginWorker(b.ctx, store.PluginWorker{Name: "tool", Path: "/p", SHA256: sha256A, Processes: 1})
	noErr(t, err, "plugin worker of default")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-b", Name: "y",
		Kind: store.KindPlugin, Plugin: "tool", CrashPolicy: store.CrashRestart})
	wantIs(t, err, store.ErrNotFound, "binding another namespace's plugin worker")

	// A module uploaded again to a namespace it is visible in is not new.
	_, created := b.nsModule("team-b", "agent module")
	wantEq(t, created, false, "a second upload to team-b")
}

func testNamespacesInvalid(t *testing.T, b *bundle) {
	m := b.module("agent module")
	for _, ns := range []string{"Team", "a/b", " ", "-x"} {
		_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: ns, Name: "x",
			ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("CreateAgent in namespace %q", ns))
		_, _, err = b.s.PutModule(b.ctx, store.PutModuleParams{Namespace: ns, Digest: m.Digest, ABIVersion: abi.Version, Bytes: []byte("x")})
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("PutModule in namespace %q", ns))
		_, _, err = b.s.PutSecret(b.ctx, ns, "K", []byte("sealed"))
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("PutSecret in namespace %q", ns))
		_, _, err = b.s.PutPluginWorker(b.ctx, store.PluginWorker{Namespace: ns, Name: "tool", Path: "/p", SHA256: sha256A, Processes: 1})
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("PutPluginWorker in namespace %q", ns))
	}
}

func testNamespacesQuotaReads(t *testing.T, b *bundle) {
	m, _ := b.nsModule("team-a", "quota")
	a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: uuid.NewString(), Namespace: "team-a",
		Name: "counted", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	noErr(t, err, "CreateAgent in team-a")
	keys := []store.ActorKey{b.sessionOf(a.UID, store.CrashRestart), b.sessionOf(a.UID, store.CrashRestart), b.sessionOf(a.UID, store.CrashRestart)}
	b.session() // the default namespace's, not counted in team-a
	_, err = b.s.DestroySession(b.ctx, keys[0])
	noErr(t, err, "DestroySession")
	for limit, want := range map[int64]int64{1: 1, 2: 2, 10: 2} {
		n, err := b.s.LiveSessionsUpTo(b.ctx, "team-a", limit)
		noErr(t, err, "LiveSessionsUpTo")
		wantEq(t, n, want, fmt.Sprintf("team-a's live sessions up to %d", limit))
	}
	n, err := b.s.LiveSessionsUpTo(b.ctx, "team-b", 10)
	noErr(t, err, "LiveSessionsUpTo of an empty namespace")
	wantEq(t, n, int64(0), "team-b's live sessions")
	tokens, err := b.s.NamespaceTokensSince(b.ctx, "team-a", time.Now().Add(-time.Hour))
	noErr(t, err, "NamespaceTokensSince")
	wantEq(t, tokens, int64(0), "team-a's tokens without model calls")
}
