package storetest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/store"
)

func tokenCases() []testCase {
	return []testCase{
		{"Tokens/CreateGetListRevokeRoundTrip", testTokens},
		{"Tokens/RevokeIsIdempotentAndKeepsTheFirstTime", testTokenRevokeTwice},
		{"Tokens/InvalidInputsAreRefusedAndStoreNothing", testTokensInvalid},
		{"Audit/AppendedRowsPageNewestFirstByNamespace", testAudit},
		{"Audit/InvalidRowsAndPagesAreRefused", testAuditInvalid},
		{"Audit/ConcurrentAppendsEachReturnTheirOwnStoredRow", testAuditConcurrent},
		{"Audit/AnAppendCarriesItsCallsRowOnlyWhenItCreatesTheEvent", testAuditWithAppend},
	}
}

func tokenParams(id, ns, role string) store.CreateTokenParams {
	h := sha256.Sum256([]byte("secret of " + id))
	return store.CreateTokenParams{ID: id, Namespace: ns, Role: role, Name: "token " + id, CreatedBy: "bootstrap", Hash: h[:]}
}

func testTokens(t *testing.T, b *bundle) {
	p := tokenParams("00000000000000a1", "team-a", "operator")
	tok, err := b.s.CreateToken(b.ctx, p)
	noErr(t, err, "CreateToken")
	wantEq(t, tok.ID, p.ID, "ID")
	wantEq(t, tok.Namespace, "team-a", "Namespace")
	wantEq(t, tok.Role, "operator", "Role")
	wantEq(t, tok.Name, p.Name, "Name")
	wantEq(t, tok.CreatedBy, "bootstrap", "CreatedBy")
	if tok.CreatedAt.IsZero() || tok.RevokedAt != nil || tok.Hash != nil {
		t.Fatalf("created token: %+v (want a creation time, no revocation, no hash)", tok)
	}
	_, err = b.s.CreateToken(b.ctx, p)
	wantIs(t, err, store.ErrConflict, "CreateToken of an existing id")

	got, err := b.s.GetToken(b.ctx, p.ID)
	noErr(t, err, "GetToken")
	wantBytes(t, got.Hash, p.Hash, "GetToken's hash")
	if !got.CreatedAt.Equal(tok.CreatedAt) || got.Role != "operator" || got.Namespace != "team-a" {
		t.Fatalf("GetToken = %+v, created %+v", got, tok)
	}
	_, err = b.s.GetToken(b.ctx, "00000000000000ff")
	wantIs(t, err, store.ErrNotFound, "GetToken of an unknown id")

	time.Sleep(2 * time.Millisecond) // created_at orders the list, at ms precision
	_, err = b.s.CreateToken(b.ctx, tokenParams("00000000000000b1", "team-b", "reader"))
	noErr(t, err, "CreateToken b1")
	time.Sleep(2 * time.Millisecond)
	_, err = b.s.CreateToken(b.ctx, tokenParams("00000000000000a2", "team-a", "admin"))
	noErr(t, err, "CreateToken a2")

	ids := func(ns string) string {
		t.Helper()
		list, err := b.s.ListTokens(b.ctx, ns)
		noErr(t, err, "ListTokens "+ns)
		var out []string
		for _, tk := range list {
			if tk.Hash != nil {
				t.Fatalf("ListTokens answered a hash: %+v", tk)
			}
			out = append(out, tk.ID)
		}
		return strings.Join(out, ",")
	}
	wantEq(t, ids("team-a"), "00000000000000a1,00000000000000a2", "tokens of team-a")
	wantEq(t, ids("team-b"), "00000000000000b1", "tokens of team-b")
	wantEq(t, ids(""), "00000000000000a1,00000000000000b1,00000000000000a2", "every token")
	wantEq(t, ids("team-c"), "", "tokens of an empty namespace")

	rev, err := b.s.RevokeToken(b.ctx, p.ID)
	noErr(t, err, "RevokeToken")
	if rev.RevokedAt == nil || rev.RevokedAt.Before(tok.CreatedAt) {
		t.Fatalf("revoked token: %+v", rev)
	}
	got, err = b.s.GetToken(b.ctx, p.ID)
	noErr(t, err, "GetToken of a revoked token")
	if got.RevokedAt == nil || !got.RevokedAt.Equal(*rev.RevokedAt) {
		t.Fatalf("GetToken of a revoked token: revoked_at %s, want %s", tsp(got.RevokedAt), tsp(rev.RevokedAt))
	}
	_, err = b.s.RevokeToken(b.ctx, "00000000000000ff")
	wantIs(t, err, store.ErrNotFound, "RevokeToken of an unknown id")
	list, err := b.s.ListTokens(b.ctx, "team-a")
	noErr(t, err, "ListTokens after the revoke")
	if len(list) != 2 || list[0].RevokedAt == nil || list[1].RevokedAt != nil {
		t.Fatalf("ListTokens after the revoke: %+v", list)
	}
}

func testTokenRevokeTwice(t *testing.T, b *bundle) {
	p := tokenParams("0123456789abcdef", "default", "client")
	_, err := b.s.CreateToken(b.ctx, p)
	noErr(t, err, "CreateToken")
	first, err := b.s.RevokeToken(b.ctx, p.ID)
	noErr(t, err, "RevokeToken")
	time.Sleep(3 * time.Millisecond)
	again, err := b.s.RevokeToken(b.ctx, p.ID)
	noErr(t, err, "RevokeToken again")
	if first.RevokedAt == nil || again.RevokedAt == nil || !again.RevokedAt.Equal(*first.RevokedAt) {
		t.Fatalf("revoked twice: first %s, again %s", tsp(first.RevokedAt), tsp(again.RevokedAt))
	}
}

func testTokensInvalid(t *testing.T, b *bundle) {
	ok := tokenParams("00000000000000c1", "default", "reader")
	for _, tc := range []struct {
		what string
		edit func(p *store.CreateTokenParams)
	}{
		{"a short id", func(p *store.CreateTokenParams) { p.ID = "abc" }},
		{"an uppercase id", func(p *store.CreateTokenParams) { p.ID = "00000000000000C1" }},
		{"no namespace", func(p *store.CreateTokenParams) { p.Namespace = "" }},
		{"an unknown role", func(p *store.CreateTokenParams) { p.Role = "root" }},
		{"a long name", func(p *store.CreateTokenParams) { p.Name = strings.Repeat("n", store.MaxTokenNameLen+1) }},
		{"no creator", func(p *store.CreateTokenParams) { p.CreatedBy = "" }},
		{"a short hash", func(p *store.CreateTokenParams) { p.Hash = p.Hash[:16] }},
	} {
		p := ok
		p.Hash = bytes.Clone(ok.Hash)
		tc.edit(&p)
		_, err := b.s.CreateToken(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, "CreateToken with "+tc.what)
	}
	for _, id := range []string{"", "x", "../etc/passwd", strings.Repeat("a", 17)} {
		_, err := b.s.GetToken(b.ctx, id)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("GetToken(%q)", id))
		_, err = b.s.RevokeToken(b.ctx, id)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("RevokeToken(%q)", id))
	}
	list, err := b.s.ListTokens(b.ctx, "")
	noErr(t, err, "ListTokens")
	wantEq(t, len(list), 0, "tokens stored by refused creates")
}

func testAudit(t *testing.T, b *bundle) {
	before := time.Now().Add(-time.Minute)
	var ids []int64
	for i := range 5 {
		ns := "team-a"
		if i%2 == 1 {
			ns = "team-b"
		}
		e, err := b.s.AppendAudit(b.ctx, store.AppendAuditParams{
			TokenID: fmt.Sprintf("tok%d", i), Namespace: ns, Action: "session.destroy",
			Object: fmt.Sprintf("/v1/agents/a/sessions/s%d", i), Result: "ok", Status: 200,
		})
		noErr(t, err, "AppendAudit")
		if e.ID <= 0 || e.At.Before(before) || e.Namespace != ns || e.TokenID != fmt.Sprintf("tok%d", i) || e.Status != 200 {
			t.Fatalf("appended %+v", e)
		}
		if len(ids) > 0 && e.ID <= ids[len(ids)-1] {
			t.Fatalf("audit ids not increasing: %d after %v", e.ID, ids)
		}
		ids = append(ids, e.ID)
	}
	page := func(p store.ListAuditParams) []int64 {
		t.Helper()
		es, err := b.s.ListAudit(b.ctx, p)
		noErr(t, err, fmt.Sprintf("ListAudit(%+v)", p))
		out := []int64{}
		for _, e := range es {
			out = append(out, e.ID)
		}
		return out
	}
	same := func(got, want []int64, what string) {
		t.Helper()
		wantEq(t, fmt.Sprint(got), fmt.Sprint(want), what)
	}
	same(page(store.ListAuditParams{}), []int64{ids[4], ids[3], ids[2], ids[1], ids[0]}, "every row, newest first")
	same(page(store.ListAuditParams{Limit: 2}), []int64{ids[4], ids[3]}, "first page of 2")
	same(page(store.ListAuditParams{Limit: 2, Before: ids[3]}), []int64{ids[2], ids[1]}, "second page of 2")
	same(page(store.ListAuditParams{Limit: 2, Before: ids[1]}), []int64{ids[0]}, "last page")
	same(page(store.ListAuditParams{Namespace: "team-b"}), []int64{ids[3], ids[1]}, "team-b's rows")
	same(page(store.ListAuditParams{Namespace: "team-a", Before: ids[4]}), []int64{ids[2], ids[0]}, "team-a's rows before the newest")
	same(page(store.ListAuditParams{Namespace: "nobody"}), []int64{}, "an empty namespace's rows")
	es, err := b.s.ListAudit(b.ctx, store.ListAuditParams{Limit: 1})
	noErr(t, err, "ListAudit")
	e := es[0]
	if e.Action != "session.destroy" || e.Object != "/v1/agents/a/sessions/s4" || e.Result != "ok" || e.TokenID != "tok4" {
		t.Fatalf("read back %+v", e)
	}
}

func testAuditInvalid(t *testing.T, b *bundle) {
	for _, p := range []store.AppendAuditParams{
		{Action: "x", Result: "ok"},
		{TokenID: "t", Result: "ok"},
		{TokenID: "t", Action: "x"},
		{TokenID: "t", Action: "x", Result: "ok", Object: strings.Repeat("o", 1025)},
		{TokenID: "t", Action: "x", Result: "ok", Status: -1},
		{TokenID: "t", Action: "x", Result: "ok", Status: 1000},
		{TokenID: "t", Action: "x", Result: "ok", Status: 1<<32 + 202},
	} {
		_, err := b.s.AppendAudit(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("AppendAudit(%+v)", p))
	}
	for _, p := range []store.ListAuditParams{{Limit: -1}, {Limit: store.MaxAuditLimit + 1}, {Before: -1}} {
		_, err := b.s.ListAudit(b.ctx, p)
		wantIs(t, err, store.ErrInvalid, fmt.Sprintf("ListAudit(%+v)", p))
	}
	es, err := b.s.ListAudit(b.ctx, store.ListAuditParams{})
	noErr(t, err, "ListAudit")
	wantEq(t, len(es), 0, "rows stored by refused appends")
}

// testAuditConcurrent: audit rows appended at once (a driver may send them
// in one batch and commit) each come back as their own row, with their own
// id, and each is stored and listed once its AppendAudit returned.
func testAuditConcurrent(t *testing.T, b *bundle) {
	const callers, each = 16, 8
	got := make([][]store.AuditEntry, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range each {
				p := store.AppendAuditParams{TokenID: fmt.Sprintf("tok%d", i), Namespace: "team-a", Action: "signal.send",
					Object: fmt.Sprintf("/v1/agents/a/sessions/s%d-%d/signals", i, j), Result: "ok", Status: 202}
				e, err := b.s.AppendAudit(b.ctx, p)
				if err != nil {
					t.Errorf("caller %d row %d: %v", i, j, err)
					return
				}
				if e.ID <= 0 || e.TokenID != p.TokenID || e.Object != p.Object || e.Status != 202 {
					t.Errorf("caller %d row %d: got %+v back", i, j, e)
					return
				}
				// Stored when AppendAudit returned: a reader finds it.
				es, err := b.s.ListAudit(b.ctx, store.ListAuditParams{Before: e.ID + 1, Limit: 1})
				if err != nil || len(es) != 1 || es[0].ID != e.ID || es[0].Object != p.Object {
					t.Errorf("caller %d row %d (id %d) read back: %+v, %v", i, j, e.ID, es, err)
					return
				}
				got[i] = append(got[i], e)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ids := map[int64]bool{}
	for i := range got {
		for j, e := range got[i] {
			if ids[e.ID] {
				t.Fatalf("id %d returned twice", e.ID)
			}
			ids[e.ID] = true
			if j > 0 && e.ID <= got[i][j-1].ID {
				t.Fatalf("caller %d: row %d has id %d after %d", i, j, e.ID, got[i][j-1].ID)
			}
		}
	}
	es, err := b.s.ListAudit(b.ctx, store.ListAuditParams{Limit: store.MaxAuditLimit})
	noErr(t, err, "ListAudit")
	wantEq(t, len(es), callers*each, "rows stored")
	for _, e := range es {
		if !ids[e.ID] {
			t.Fatalf("stored row %d was returned to no caller", e.ID)
		}
	}
}

// An append that carries its call's audit row (AppendEventParams.Audit)
// writes it with the event, and only when it creates one: an idempotent
// re-send, an append to a destroyed session or one refused by a turn in
// flight writes none (the caller writes the row of its answer), and an
// invalid row is refused before anything is written. Concurrent appends,
// each with its row, store each row once beside its event.
func testAuditWithAppend(t *testing.T, b *bundle) {
	key := b.session()
	row := func(obj string) *store.AppendAuditParams {
		return &store.AppendAuditParams{TokenID: "tok1", Namespace: "team-a", Action: "signal.send", Object: obj, Result: "ok", Status: 202}
	}
	rows := func() []store.AuditEntry {
		es, err := b.s.ListAudit(b.ctx, store.ListAuditParams{Limit: store.MaxAuditLimit})
		noErr(t, err, "ListAudit")
		return es
	}
	p := store.AppendEventParams{Key: key, Kind: "message", Payload: []byte(`{"message":"one"}`), IdempotencyKey: "k1", Audit: row("/first")}
	e, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "AppendEvent with an audit row")
	wantEq(t, created, true, "created")
	es := rows()
	if len(es) != 1 || es[0].Object != "/first" || es[0].TokenID != "tok1" || es[0].Action != "signal.send" ||
		es[0].Result != "ok" || es[0].Status != 202 || es[0].Namespace != "team-a" {
		t.Fatalf("audit rows after the append: %+v, want the one row it carried", es)
	}

	p.Audit = row("/again")
	again, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "AppendEvent re-sent with its idempotency key")
	wantEq(t, created, false, "created on a re-send")
	wantEq(t, again.ID, e.ID, "the re-send's event")
	wantEq(t, len(rows()), 1, "audit rows after an idempotent re-send")

	bad := *row("/bad")
	bad.TokenID = ""
	_, _, err = b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "message", Payload: []byte(`{"message":"bad"}`), Audit: &bad})
	wantIs(t, err, store.ErrInvalid, "AppendEvent with an audit row without a token id")
	wantEq(t, len(b.events(key)), 1, "events after a refused audit row")

	var wg sync.WaitGroup
	const n = 12
	keys := make([]store.ActorKey, n)
	for i := range keys {
		keys[i] = b.session()
	}
	for i, k := range keys {
		wg.Go(func() {
			_, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: k, Kind: "message",
				Payload: []byte(`{"message":"x"}`), Audit: row(fmt.Sprintf("/c%d", i))})
			if err != nil || !created {
				t.Errorf("concurrent append %d: created %v, %v", i, created, err)
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for _, r := range rows() {
		seen[r.Object]++
	}
	for i, k := range keys {
		if seen[fmt.Sprintf("/c%d", i)] != 1 || len(b.events(k)) != 1 {
			t.Fatalf("concurrent append %d: %d audit rows, %d events; want 1 and 1", i, seen[fmt.Sprintf("/c%d", i)], len(b.events(k)))
		}
	}

	busy := b.session()
	b.message(busy, "running")
	b.next(b.claim(busy, time.Minute)) // a turn in flight
	before := len(rows())
	_, _, err = b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: busy, Kind: "message", Payload: []byte(`{"message":"no"}`),
		RefuseIfInFlight: true, Audit: row("/refused")})
	var tif *store.TurnInFlightError
	if !errors.As(err, &tif) {
		t.Fatalf("AppendEvent refused by a turn in flight: %v, want a *TurnInFlightError", err)
	}
	wantEq(t, len(rows()), before, "audit rows after a refused append")

	gone := b.session()
	_, err = b.s.DestroySession(b.ctx, gone)
	noErr(t, err, "DestroySession")
	before = len(rows())
	_, _, err = b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: gone, Kind: "message", Payload: []byte(`{"message":"late"}`), Audit: row("/gone")})
	wantIs(t, err, store.ErrSessionDestroyed, "AppendEvent to a destroyed session")
	wantEq(t, len(rows()), before, "audit rows after an append to a destroyed session")
}
