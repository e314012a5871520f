package storetest

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Agent kinds and plugin workers (store/storetest/README.md "Agent kinds and plugin workers").
func pluginCases() []testCase {
	return []testCase{
		{"PluginWorkers/PutGetListReplace", testPluginWorkers},
		{"PluginWorkers/InvalidIsRefused", testPluginWorkerInvalid},
		{"PluginWorkers/PutRaceCreatesOnce", testPluginWorkerPutRace},
		{"Agents/KindDefaultsToWasm", testAgentKindDefault},
		{"Agents/PluginKindCreateGetList", testPluginAgents},
		{"Agents/UnknownBindingNotFoundWrongCombinationRefused", testAgentBindingErrors},
		{"Agents/UpsertSwitchesWasmToPluginAndBack", testAgentKindSwitch},
		{"Agents/PluginAgentSessionRunsTurns", testPluginAgentTurn},
	}
}

const (
	sha256A = "0000000000000000000000000000000000000000000000000000000000000000"
	sha256B = "1111111111111111111111111111111111111111111111111111111111111111"
)

// pluginWorker registers a plugin worker with one process and no env.
func (b *bundle) pluginWorker(name string) store.PluginWorker {
	b.t.Helper()
	w, created, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{
		Name: name, Path: "/opt/plugins/" + name, SHA256: sha256A, Processes: 1,
	})
	noErr(b.t, err, "PutPluginWorker")
	wantEq(b.t, created, true, "PutPluginWorker created")
	return w
}

// pluginAgent registers an agent of kind plugin.
func (b *bundle) pluginAgent(name, plugin string, policy store.CrashPolicy) store.Agent {
	b.t.Helper()
	a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: name, Kind: store.KindPlugin, Plugin: plugin, CrashPolicy: policy,
	})
	noErr(b.t, err, "CreateAgent plugin")
	return a
}

// wantPluginWorker compares every field but the times.
func wantPluginWorker(t testing.TB, got, want store.PluginWorker, what string) {
	t.Helper()
	wantEq(t, got.Name, want.Name, what+" Name")
	wantEq(t, got.Path, want.Path, what+" Path")
	wantEq(t, got.SHA256, want.SHA256, what+" SHA256")
	wantEq(t, got.Processes, want.Processes, what+" Processes")
	// nil and empty are the same environment.
	if !maps.Equal(got.Env, want.Env) {
		t.Fatalf("%s Env = %v, want %v", what, got.Env, want.Env)
	}
	if got.CreatedAt.IsZero() || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("%s times: created %s, updated %s", what, ts(got.CreatedAt), ts(got.UpdatedAt))
	}
}

// wantAgent compares the identity and binding of an agent.
func wantAgent(t testing.TB, got store.Agent, uid, name, kind, module, plugin string, what string) {
	t.Helper()
	wantEq(t, got.UID, uid, what+" UID")
	wantEq(t, got.Name, name, what+" Name")
	wantEq(t, got.Kind, kind, what+" Kind")
	wantEq(t, got.ModuleDigest, module, what+" ModuleDigest")
	wantEq(t, got.Plugin, plugin, what+" Plugin")
}

func testPluginWorkers(t *testing.T, b *bundle) {
	list, err := b.s.ListPluginWorkers(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListPluginWorkers of a new store")
	wantEq(t, len(list), 0, "plugin workers of a new store")

	_, err = b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, "nope")
	wantIs(t, err, store.ErrNotFound, "GetPluginWorker unknown")

	// Env nil is stored as an empty environment.
	bare := store.PluginWorker{Name: "m-bare", Path: "/opt/bare", SHA256: sha256A, Processes: 1}
	got, created, err := b.s.PutPluginWorker(b.ctx, bare)
	noErr(t, err, "PutPluginWorker bare")
	wantEq(t, created, true, "PutPluginWorker bare created")
	wantPluginWorker(t, got, bare, "PutPluginWorker bare")
	wantEq(t, len(got.Env), 0, "Env of a worker put without one")

	first := store.PluginWorker{
		Name: "a-coder", Path: "/opt/plugins/coder", SHA256: sha256A, Processes: 2,
		Env: map[string]string{"HOME": "/var/lib/coder", "EMPTY": "", "QUOTED": `a "b" \ c=d`},
	}
	put, created, err := b.s.PutPluginWorker(b.ctx, first)
	noErr(t, err, "PutPluginWorker")
	wantEq(t, created, true, "PutPluginWorker created")
	wantPluginWorker(t, put, first, "PutPluginWorker result")

	get, err := b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, first.Name)
	noErr(t, err, "GetPluginWorker")
	wantPluginWorker(t, get, first, "GetPluginWorker")
	wantEq(t, get.CreatedAt.Equal(put.CreatedAt), true, "GetPluginWorker CreatedAt equals the put's")

	// A second put of the name replaces the registration: every field,
	// including the whole environment; CreatedAt is kept.
	second := store.PluginWorker{
		Name: first.Name, Path: "/opt/plugins/coder-v2", SHA256: sha256B, Processes: 5,
		Env: map[string]string{"MODE": "v2"},
	}
	replaced, created, err := b.s.PutPluginWorker(b.ctx, second)
	noErr(t, err, "PutPluginWorker replace")
	wantEq(t, created, false, "PutPluginWorker replace created")
	wantPluginWorker(t, replaced, second, "PutPluginWorker replace result")
	wantEq(t, replaced.CreatedAt.Equal(put.CreatedAt), true, "replace keeps CreatedAt")
	if replaced.UpdatedAt.Before(put.UpdatedAt) {
		t.Fatalf("replace UpdatedAt %s before the first put's %s", ts(replaced.UpdatedAt), ts(put.UpdatedAt))
	}
	get, err = b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, first.Name)
	noErr(t, err, "GetPluginWorker after replace")
	wantPluginWorker(t, get, second, "GetPluginWorker after replace")

	// Replacing with a nil Env clears it.
	third := second
	third.Env = nil
	_, created, err = b.s.PutPluginWorker(b.ctx, third)
	noErr(t, err, "PutPluginWorker nil env")
	wantEq(t, created, false, "PutPluginWorker nil env created")
	get, err = b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, first.Name)
	noErr(t, err, "GetPluginWorker after nil env")
	wantEq(t, len(get.Env), 0, "Env after a put without one")

	b.pluginWorker("z-last")
	list, err = b.s.ListPluginWorkers(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListPluginWorkers")
	var names []string
	for _, w := range list {
		names = append(names, w.Name)
		if w.Name == first.Name {
			wantPluginWorker(t, w, third, "listed worker")
		}
	}
	wantEq(t, fmt.Sprint(names), "[a-coder m-bare z-last]", "ListPluginWorkers by name")
}

func testPluginWorkerInvalid(t *testing.T, b *bundle) {
	for _, n := range []int{0, -1} {
		_, _, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{Name: "w", Path: "/p", SHA256: sha256A, Processes: n})
		if err == nil {
			t.Fatalf("PutPluginWorker with Processes %d: no error", n)
		}
	}
	if _, _, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{Path: "/p", SHA256: sha256A, Processes: 1}); err == nil {
		t.Fatalf("PutPluginWorker without a name: no error")
	}
	_, err := b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, "w")
	wantIs(t, err, store.ErrNotFound, "GetPluginWorker after refused puts")
	list, err := b.s.ListPluginWorkers(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListPluginWorkers")
	wantEq(t, len(list), 0, "plugin workers after refused puts")

	// A refused replace leaves the registration as it was.
	w := b.pluginWorker("w")
	_, _, err = b.s.PutPluginWorker(b.ctx, store.PluginWorker{Name: "w", Path: "/other", SHA256: sha256B, Processes: 0})
	if err == nil {
		t.Fatalf("PutPluginWorker replace with Processes 0: no error")
	}
	got, err := b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, "w")
	noErr(t, err, "GetPluginWorker")
	wantPluginWorker(t, got, w, "worker after a refused replace")
}

func testAgentKindDefault(t *testing.T, b *bundle) {
	// setup created b.agent with Kind "".
	wantAgent(t, b.agent, b.agent.UID, b.agent.Name, store.KindWasm, b.agent.ModuleDigest, "", "CreateAgent without a kind")
	if b.agent.ModuleDigest == "" {
		t.Fatalf("wasm agent without its module digest: %+v", b.agent)
	}
	explicit, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: "explicit-wasm", Kind: store.KindWasm, ModuleDigest: b.agent.ModuleDigest,
		CrashPolicy: store.CrashRestart,
	})
	noErr(t, err, "CreateAgent kind wasm")
	wantAgent(t, explicit, explicit.UID, "explicit-wasm", store.KindWasm, b.agent.ModuleDigest, "", "CreateAgent kind wasm")
	got, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.UID)
	noErr(t, err, "GetAgent")
	wantAgent(t, got, b.agent.UID, b.agent.Name, store.KindWasm, b.agent.ModuleDigest, "", "GetAgent wasm")
}

func testPluginAgents(t *testing.T, b *bundle) {
	w := b.pluginWorker("coder")
	a, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: "plugin-agent", Kind: store.KindPlugin, Plugin: w.Name, CrashPolicy: store.CrashSleep,
	})
	noErr(t, err, "CreateAgent plugin")
	wantAgent(t, a, a.UID, "plugin-agent", store.KindPlugin, "", w.Name, "CreateAgent plugin")
	wantEq(t, a.CrashPolicy, store.CrashSleep, "CreateAgent plugin CrashPolicy")
	if a.UID == "" || a.CreatedAt.IsZero() || a.UpdatedAt.IsZero() {
		t.Fatalf("CreateAgent plugin: %+v", a)
	}

	byName, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, "plugin-agent")
	noErr(t, err, "GetAgent plugin by name")
	wantAgent(t, byName, a.UID, "plugin-agent", store.KindPlugin, "", w.Name, "GetAgent plugin by name")
	byUID, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, a.UID)
	noErr(t, err, "GetAgent plugin by uid")
	wantAgent(t, byUID, a.UID, "plugin-agent", store.KindPlugin, "", w.Name, "GetAgent plugin by uid")

	// A taken name is a conflict whatever the kind.
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: "plugin-agent", Kind: store.KindPlugin, Plugin: w.Name, CrashPolicy: store.CrashSleep,
	})
	wantIs(t, err, store.ErrConflict, "CreateAgent plugin with a taken name")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: b.agent.Name, Kind: store.KindPlugin, Plugin: w.Name, CrashPolicy: store.CrashSleep,
	})
	wantIs(t, err, store.ErrConflict, "CreateAgent plugin with a wasm agent's name")

	// Replacing the plugin worker keeps the agents bound to it by name.
	_, created, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{Name: w.Name, Path: "/new", SHA256: sha256B, Processes: 3})
	noErr(t, err, "PutPluginWorker replace")
	wantEq(t, created, false, "PutPluginWorker replace created")

	list, err := b.s.ListAgents(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListAgents")
	var got []string
	for _, la := range list {
		got = append(got, la.Name+":"+la.Kind+":"+la.Plugin+":"+fmt.Sprint(la.ModuleDigest != ""))
	}
	want := []string{
		b.agent.Name + ":wasm::true",
		"plugin-agent:plugin:coder:false",
	}
	wantEq(t, fmt.Sprint(got), fmt.Sprint(want), "ListAgents kinds and bindings")
}

// wantPlainError asserts err is an error but none of the sentinels a caller
// would mistake it for.
func wantPlainError(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) {
		t.Fatalf("%s: error %v is a sentinel, want a plain error", what, err)
	}
}

func testAgentBindingErrors(t *testing.T, b *bundle) {
	w := b.pluginWorker("coder")
	m := b.agent.ModuleDigest
	create := func(name, kind, module, plugin string) error {
		_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
			UID: uuid.NewString(), Name: name, Kind: kind, ModuleDigest: module, Plugin: plugin, CrashPolicy: store.CrashRestart,
		})
		return err
	}
	wantIs(t, create("p-unknown", store.KindPlugin, "", "no-such-plugin"), store.ErrNotFound,
		"plugin agent of an unknown plugin worker")
	wantIs(t, create("p-none", store.KindPlugin, "", ""), store.ErrNotFound, "plugin agent without a plugin worker")
	wantIs(t, create("w-unknown", store.KindWasm, digest([]byte("nope")), ""), store.ErrNotFound,
		"wasm agent of an unknown module")
	wantIs(t, create("w-none", store.KindWasm, "", ""), store.ErrNotFound, "wasm agent without a module")
	wantIs(t, create("d-none", "", "", ""), store.ErrNotFound, "default-kind agent without a module")

	wantPlainError(t, create("w-with-plugin", store.KindWasm, m, w.Name), "wasm agent naming a plugin worker")
	wantPlainError(t, create("d-with-plugin", "", m, w.Name), "default-kind agent naming a plugin worker")
	wantPlainError(t, create("p-with-module", store.KindPlugin, m, w.Name), "plugin agent naming a module")
	wantPlainError(t, create("bad-kind", "docker", m, ""), "agent of an unknown kind")

	// An upsert is validated the same way and leaves the agent as it was.
	for _, p := range []store.CreateAgentParams{
		{Kind: store.KindPlugin, Plugin: "no-such-plugin"},
		{Kind: store.KindPlugin, Plugin: w.Name, ModuleDigest: m},
		{Kind: store.KindWasm, ModuleDigest: digest([]byte("nope"))},
	} {
		p.UID, p.Name, p.CrashPolicy, p.Upsert = uuid.NewString(), b.agent.Name, store.CrashDestroy, true
		if _, err := b.s.CreateAgent(b.ctx, p); err == nil {
			t.Fatalf("CreateAgent upsert %+v: no error", p)
		}
	}
	got, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.UID)
	noErr(t, err, "GetAgent")
	wantAgent(t, got, b.agent.UID, b.agent.Name, store.KindWasm, m, "", "agent after refused upserts")
	wantEq(t, got.CrashPolicy, b.agent.CrashPolicy, "CrashPolicy after refused upserts")

	list, err := b.s.ListAgents(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListAgents")
	wantEq(t, len(list), 1, "agents after refused creates")
}

func testAgentKindSwitch(t *testing.T, b *bundle) {
	w := b.pluginWorker("coder")
	key := b.session()

	toPlugin, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: b.agent.Name, Kind: store.KindPlugin, Plugin: w.Name,
		CrashPolicy: store.CrashSleep, Upsert: true,
	})
	noErr(t, err, "CreateAgent upsert to plugin")
	wantAgent(t, toPlugin, b.agent.UID, b.agent.Name, store.KindPlugin, "", w.Name, "upsert to plugin")
	wantEq(t, toPlugin.CrashPolicy, store.CrashSleep, "upsert to plugin CrashPolicy")
	wantEq(t, toPlugin.CreatedAt.Equal(b.agent.CreatedAt), true, "upsert keeps CreatedAt")
	if toPlugin.UpdatedAt.Before(b.agent.UpdatedAt) {
		t.Fatalf("upsert UpdatedAt %s before %s", ts(toPlugin.UpdatedAt), ts(b.agent.UpdatedAt))
	}
	got, err := b.s.GetAgent(b.ctx, store.DefaultNamespace, b.agent.Name)
	noErr(t, err, "GetAgent after upsert to plugin")
	wantAgent(t, got, b.agent.UID, b.agent.Name, store.KindPlugin, "", w.Name, "GetAgent after upsert to plugin")

	// The agent's sessions survive the switch and run under the new binding.
	ss := b.getSession(key)
	wantEq(t, ss.Status, store.SessionActive, "session after the switch")
	b.message(key, "hello plugin")
	act := b.claim(key, LongTTL)
	d, err := b.tryNext(act, true, "plugin:"+w.Name)
	noErr(t, err, "NextDelivery after the switch")
	wantEq(t, d.Delivery.Binding, "plugin:"+w.Name, "binding recorded after the switch")
	b.commit(d.Delivery.TurnRef(), "hi", "")

	m2 := b.module("switch back")
	toWasm, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Name: b.agent.Name, ModuleDigest: m2.Digest, CrashPolicy: store.CrashRestart, Upsert: true,
	})
	noErr(t, err, "CreateAgent upsert back to wasm")
	wantAgent(t, toWasm, b.agent.UID, b.agent.Name, store.KindWasm, m2.Digest, "", "upsert back to wasm")
	list, err := b.s.ListAgents(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListAgents")
	wantEq(t, len(list), 1, "agents after the switches")
	wantAgent(t, list[0], b.agent.UID, b.agent.Name, store.KindWasm, m2.Digest, "", "listed agent")

	// An unbound plugin worker can still be listed and replaced.
	_, created, err := b.s.PutPluginWorker(b.ctx, store.PluginWorker{Name: w.Name, Path: w.Path, SHA256: sha256B, Processes: 1})
	noErr(t, err, "PutPluginWorker after the switch back")
	wantEq(t, created, false, "PutPluginWorker after the switch back created")
}

func testPluginAgentTurn(t *testing.T, b *bundle) {
	w := b.pluginWorker("coder")
	a := b.pluginAgent("plugin-agent", w.Name, store.CrashRestart)
	key := b.sessionOf(a.UID, "")
	ss := b.getSession(key)
	wantEq(t, ss.CrashPolicy, store.CrashRestart, "session policy from the plugin agent")

	b.message(key, "hello")
	act := b.claim(key, LongTTL)
	d, err := b.tryNext(act, true, "plugin:"+w.Name)
	noErr(t, err, "NextDelivery")
	turn := b.commit(d.Delivery.TurnRef(), "hi from a plugin", "state")
	wantMessages(t, turn.Messages, abi.RoleUser, "hello", abi.RoleAssistant, "hi from a plugin")
	wantEq(t, b.getSession(key).TurnCount, int64(1), "TurnCount")
}

func testPluginWorkerPutRace(t *testing.T, b *bundle) {
	const n = 16
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, created[i], errs[i] = b.s.PutPluginWorker(b.ctx, store.PluginWorker{
				Name: "raced", Path: fmt.Sprintf("/opt/%d", i), SHA256: sha256A, Processes: i + 1,
			})
		})
	}
	close(start)
	wg.Wait()
	creators := 0
	for i := range n {
		noErr(t, errs[i], fmt.Sprintf("racer %d", i))
		if created[i] {
			creators++
		}
	}
	wantEq(t, creators, 1, "racers that created")
	w, err := b.s.GetPluginWorker(b.ctx, store.DefaultNamespace, "raced")
	noErr(t, err, "GetPluginWorker")
	// The last writer wins, whole: path and processes of the same put.
	wantEq(t, w.Path, fmt.Sprintf("/opt/%d", w.Processes-1), "path and processes of one put")
	list, err := b.s.ListPluginWorkers(b.ctx, store.DefaultNamespace)
	noErr(t, err, "ListPluginWorkers")
	wantEq(t, len(list), 1, "plugin workers after the race")
}
