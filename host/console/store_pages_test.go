package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// section returns the HTML of the page's <section id="id">.
func section(t *testing.T, body, id string) string {
	t.Helper()
	i := strings.Index(body, `<section id="`+id+`">`)
	if i < 0 {
		t.Fatalf("no section %q on the page:\n%s", id, body)
	}
	j := strings.Index(body[i:], "</section>")
	return body[i : i+j]
}

// TestOverviewShowsHostsPoolsWaitingAndTurns: the overview's store figures
// — a lease another host holds, the pool in use everywhere, a session
// waiting for capacity, the turns of the last minute — and no fabric.
func TestOverviewShowsHostsPoolsWaitingAndTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	e.signal(notes, x, "note one")
	// A lease held by another host (no event: this host never runs it).
	held := e.session(notes, "held")
	if _, err := e.st.ClaimActivation(ctx, store.ClaimActivationParams{Key: held.ActorKey, UID: uuid.NewString(),
		LeaseID: uuid.NewString(), HostID: "host-elsewhere", LeaseTTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	waiting := e.session(notes, "waiting")
	if err := e.st.SetPending(ctx, waiting.ActorKey, true); err != nil {
		t.Fatal(err)
	}

	resp, body := e.browser().get("/ui/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("overview: %d\n%s", resp.StatusCode, body)
	}
	if m := regexp.MustCompile(`<strong id="turns-last-minute">(\d+)</strong>`).FindStringSubmatch(body); m == nil || m[1] == "0" {
		t.Errorf("turns of the last minute: %v", m)
	}
	hosts := section(t, body, "hosts")
	if !regexp.MustCompile(`<code>host-elsewhere</code></td><td class="num">1</td><td class="num">0</td>`).MatchString(hosts) {
		t.Errorf("the other host's lease is not listed:\n%s", hosts)
	}
	pools := section(t, body, "pools")
	row := regexp.MustCompile(`<tr><td>default</td><td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td><td class="num">(.*?)</td></tr>`).FindStringSubmatch(pools)
	if row == nil {
		t.Fatalf("no default pool row:\n%s", pools)
	}
	if row[1] == "0" || row[3] == "0" || !strings.Contains(row[4], ">1</a>") {
		t.Errorf("default pool: capacity %s, here %s, everywhere %s, waiting %s; want a capacity, ≥ 1 everywhere, 1 waiting", row[1], row[2], row[3], row[4])
	}
	if w := section(t, body, "workers"); !strings.Contains(w, "runs no fabric") {
		t.Errorf("workers without a fabric:\n%s", w)
	}
}

// TestOverviewListsRemoteWorkers: the workers a WithWorkers source
// reports (the fabric broker's in paddock serve) are listed with their
// pools, capacity and last heartbeat.
func TestOverviewListsRemoteWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	heard := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e.svc.WithWorkers(func() []service.RemoteWorker {
		return []service.RemoteWorker{{ID: "gpu-<1>", Pools: []string{"gpu"}, Capacity: 4, InFlight: 1, Free: 3, Running: 1, LastHeard: heard}}
	})
	_, body := e.browser().get("/ui/")
	w := section(t, body, "workers")
	for _, want := range []string{"<code>gpu-&lt;1&gt;</code>", "gpu ", `<td class="num">4</td>`, "3 / 1", "2026-12-01 10:00:00Z"} {
		if !strings.Contains(w, want) {
			t.Errorf("workers section lacks %q:\n%s", want, w)
		}
	}
}

// TestSessionPageShowsTheActivationAndLease: before any claim, none; with
// a live activation, its uid, host, state, epoch, the lease by the DB clock
// and the current event.
func TestSessionPageShowsTheActivationAndLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	b := e.browser()
	_, body := b.get(sessionPath(notes, x))
	if s := section(t, body, "activation"); !strings.Contains(s, "No activation yet") {
		t.Errorf("before a claim:\n%s", s)
	}
	act, err := e.st.ClaimActivation(ctx, store.ClaimActivationParams{Key: x.ActorKey, UID: uuid.NewString(),
		LeaseID: uuid.NewString(), HostID: "host-elsewhere", LeaseTTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, body = b.get(sessionPath(notes, x))
	s := section(t, body, "activation")
	for _, want := range []string{"<code>" + act.UID + "</code> (live)", "<code>host-elsewhere</code>", `<td id="activation-state">active</td>`,
		"by the database clock", `<td id="current-event">none</td>`} {
		if !strings.Contains(s, want) {
			t.Errorf("activation section lacks %q:\n%s", want, s)
		}
	}
	if !regexp.MustCompile(`— in \d+m\d`).MatchString(s) {
		t.Errorf("the lease's time left is not shown:\n%s", s)
	}
}

// TestAgentPageListsVersions: each change of binding or crash policy is a
// version, newest first; an update that changes nothing is not.
func TestAgentPageListsVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	_, wasmBytes := wasmtest.BuildExample(t, wasmtest.Faulty)
	m2, _, err := e.svc.UploadModule(ctx, wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.UpdateAgent(ctx, notes, service.Binding{Module: notes.ModuleDigest}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.UpdateAgent(ctx, notes, service.Binding{Module: m2.Digest, CrashPolicy: "sleep"}); err != nil {
		t.Fatal(err)
	}
	_, body := e.browser().get("/ui/agents/notes")
	s := section(t, body, "versions")
	rows := regexp.MustCompile(`<tr><td class="num">(\d+)</td>`).FindAllStringSubmatch(s, -1)
	if len(rows) != 2 || rows[0][1] != "2" || rows[1][1] != "1" {
		t.Fatalf("versions %v, want 2 then 1:\n%s", rows, s)
	}
	if !strings.Contains(s, m2.Digest[:19]) || !strings.Contains(s, "<td>sleep</td>") {
		t.Errorf("version 2 does not show its module and crash policy:\n%s", s)
	}
}

// TestSessionsPageFiltersBySleepReason: "sleeping:<reason>" in the status
// select filters by reason, in the store query.
func TestSessionsPageFiltersBySleepReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "")
	notes := e.agent("notes", wasmtest.Notes)
	crashed, idle := e.session(notes, "crashed"), e.session(notes, "idle")
	if _, err := e.st.SleepSession(ctx, store.SleepSessionParams{Key: crashed.ActorKey, Reason: store.SleepReasonCrash}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.SleepSession(ctx, store.SleepSessionParams{Key: idle.ActorKey, Reason: store.SleepReasonAgent}); err != nil {
		t.Fatal(err)
	}
	b := e.browser()
	_, body := b.get("/ui/sessions?status=sleeping:crash")
	if !strings.Contains(body, crashed.SessionID[:8]) || strings.Contains(body, idle.SessionID[:8]) {
		t.Errorf("sleeping:crash shows the wrong sessions:\n%s", body)
	}
	if !strings.Contains(body, `<option selected>sleeping:crash</option>`) {
		t.Errorf("the filter is not kept selected")
	}
	_, body = b.get("/ui/sessions?status=sleeping")
	if !strings.Contains(body, crashed.SessionID[:8]) || !strings.Contains(body, idle.SessionID[:8]) {
		t.Errorf("sleeping shows the wrong sessions:\n%s", body)
	}
}
