package wasm_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// moduleError asserts err is a *wasm.ModuleError with reason whose message
// names every string in mention.
func moduleError(t *testing.T, err error, reason string, mention ...string) *wasm.ModuleError {
	t.Helper()
	var me *wasm.ModuleError
	if !errors.As(err, &me) {
		t.Fatalf("want a *wasm.ModuleError (%s), got %T: %v", reason, err, err)
	}
	if me.Reason != reason {
		t.Fatalf("want reason %s, got %s: %v", reason, me.Reason, me)
	}
	for _, m := range mention {
		if !strings.Contains(me.Error(), m) {
			t.Errorf("message %q does not mention %q", me, m)
		}
	}
	return me
}

// TestValidateAcceptsExamples: a good module validates and is loaded.
func TestValidateAcceptsExamples(t *testing.T) {
	t.Parallel()
	b := shared(t)
	_, body := wasmtest.BuildExample(t, wasmtest.Notes)
	info, err := b.rt.Validate(context.Background(), body)
	if err != nil {
		t.Fatal(err)
	}
	if info.Digest != b.notes(t) || !strings.HasPrefix(info.Digest, "sha256:") || len(info.Digest) != 7+64 ||
		info.ABIVersion != abi.Version || info.Size != len(body) {
		t.Fatalf("info %+v", info)
	}
	if !b.rt.Loaded(info.Digest) {
		t.Fatal("validated module not loaded")
	}
}

// TestValidateRejectsBadModules: each way a module can be unfit returns a
// *ModuleError that names the problem.
func TestValidateRejectsBadModules(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{TurnTimeout: 500 * time.Millisecond, InitTimeout: time.Minute})
	ctx := context.Background()
	abiExports := []string{"paddock_abi_version", "paddock_alloc", "paddock_free", "paddock_turn", "memory"}
	withStart := fixedGuest(1, []byte("{}"))
	withStart.funcs = append(withStart.funcs, wfunc{export: "_start"})
	withImport := func(module, name string, params ...byte) wmod {
		m := fixedGuest(1, []byte("{}"))
		m.imports = []wimport{{module: module, name: name, params: params}}
		return m
	}

	t.Run("not wasm", func(t *testing.T) {
		for _, body := range [][]byte{nil, []byte("hello"), []byte(`{"abi_version":1}`), []byte("\x00asm")} {
			_, err := b.rt.Validate(ctx, body)
			moduleError(t, err, wasm.ReasonNotWasm, "not a WebAssembly binary")
		}
	})
	t.Run("component", func(t *testing.T) {
		_, err := b.rt.Validate(ctx, []byte("\x00asm\x0d\x00\x01\x00rest"))
		moduleError(t, err, wasm.ReasonNotWasm, "components are not supported")
	})
	t.Run("corrupt", func(t *testing.T) {
		_, err := b.rt.Validate(ctx, []byte("\x00asm\x01\x00\x00\x00\x01\xff\xff"))
		moduleError(t, err, wasm.ReasonInvalidWasm)
	})
	t.Run("no exports", func(t *testing.T) {
		_, err := b.rt.Validate(ctx, wmod{}.bytes())
		me := moduleError(t, err, wasm.ReasonMissingExports, abiExports...)
		if !slices.Equal(me.Missing, abiExports) {
			t.Errorf("Missing = %v, want %v", me.Missing, abiExports)
		}
	})
	t.Run("some exports", func(t *testing.T) {
		m := fixedGuest(1, []byte("{}"))
		m.funcs = m.funcs[:2] // version and alloc only
		m.exportMe = false
		me := moduleError(t, second(b.rt.Validate(ctx, m.bytes())), wasm.ReasonMissingExports, "paddock_free", "paddock_turn", "memory")
		if !slices.Equal(me.Missing, []string{"paddock_free", "paddock_turn", "memory"}) {
			t.Errorf("Missing = %v", me.Missing)
		}
	})
	t.Run("wrong signature", func(t *testing.T) {
		m := fixedGuest(1, nil, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI32}, body: i32Const(0)})
		me := moduleError(t, second(b.rt.Validate(ctx, m.bytes())), wasm.ReasonMissingExports,
			"paddock_turn: want (i32, i32) -> (i64), have (i32, i32) -> (i32)")
		if len(me.Missing) != 0 {
			t.Errorf("Missing = %v", me.Missing)
		}
	})
	t.Run("command module", func(t *testing.T) {
		moduleError(t, second(b.rt.Validate(ctx, withStart.bytes())), wasm.ReasonCommandModule, "-buildmode=c-shared")
	})
	t.Run("unknown import", func(t *testing.T) {
		moduleError(t, second(b.rt.Validate(ctx, withImport("env", "foo").bytes())), wasm.ReasonBadImports, "env.foo")
	})
	t.Run("unknown host function", func(t *testing.T) {
		moduleError(t, second(b.rt.Validate(ctx, withImport("paddock", "http_get").bytes())), wasm.ReasonBadImports, "paddock.http_get")
	})
	t.Run("host function signature", func(t *testing.T) {
		moduleError(t, second(b.rt.Validate(ctx, withImport("paddock", "log", tI32).bytes())), wasm.ReasonBadImports, "paddock.log (i32)")
	})
	t.Run("other abi version", func(t *testing.T) {
		me := moduleError(t, second(b.rt.Validate(ctx, fixedGuest(2, []byte("{}")).bytes())), wasm.ReasonABIVersion, "v2", "v1")
		if me.ABIVersion != 2 {
			t.Errorf("ABIVersion = %d", me.ABIVersion)
		}
	})
	t.Run("init traps", func(t *testing.T) {
		m := fixedGuest(1, []byte("{}"))
		m.funcs = append(m.funcs, wfunc{export: "_initialize", body: []byte{opUnreachable}})
		moduleError(t, second(b.rt.Validate(ctx, m.bytes())), wasm.ReasonInitFailed, "unreachable")
	})
	t.Run("init spins", func(t *testing.T) {
		m := fixedGuest(1, []byte("{}"))
		// loop br 0 end: forever.
		m.funcs = append(m.funcs, wfunc{export: "_initialize", body: []byte{0x03, 0x40, 0x0c, 0x00, opEnd}})
		// A runtime of its own with a short InitTimeout: the spin must end
		// as a timeout, not hang validation.
		spin := setup(t, wasm.Config{InitTimeout: time.Second})
		moduleError(t, second(spin.rt.Validate(ctx, m.bytes())), wasm.ReasonInitFailed, "timeout")
	})
	t.Run("still serving", func(t *testing.T) {
		reply(t)(b.instance(t, b.notes(t)).Turn(ctx, request("count", nil, 1)))
	})
}

func second[T any](_ T, err error) error { return err }

// TestLoadChecksDigestAndLoadedness covers Load's and Instantiate's
// bookkeeping errors and Unload.
func TestLoadChecksDigestAndLoadedness(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	ctx := context.Background()
	_, body := wasmtest.BuildExample(t, wasmtest.Notes)
	if _, err := b.rt.Load(ctx, "sha256:00", body); !errors.Is(err, wasm.ErrDigestMismatch) {
		t.Errorf("Load with a wrong digest: %v", err)
	}
	if _, err := b.rt.Instantiate(ctx, "sha256:00"); !errors.Is(err, wasm.ErrNotLoaded) {
		t.Errorf("Instantiate of an unknown digest: %v", err)
	}
	digest := b.notes(t)
	running := b.instance(t, digest)
	if err := b.rt.Unload(ctx, digest); err != nil {
		t.Fatal(err)
	}
	if _, err := b.rt.Instantiate(ctx, digest); !errors.Is(err, wasm.ErrNotLoaded) {
		t.Errorf("Instantiate after Unload: %v", err)
	}
	reply(t)(running.Turn(ctx, request("count", nil, 1)))
	if _, err := b.rt.Load(ctx, digest, body); err != nil {
		t.Fatal(err)
	}
	reply(t)(b.instance(t, digest).Turn(ctx, request("count", nil, 1)))
}

// TestLoadIsSingleFlight: concurrent loads of one module compile it once.
func TestLoadIsSingleFlight(t *testing.T) {
	t.Parallel()
	warmCache(t)
	logs := &logRecorder{}
	rt, err := wasm.New(context.Background(), wasm.Config{CacheDir: wasmtest.CacheDir(t)}, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	_, body := wasmtest.BuildExample(t, wasmtest.Notes)
	digest := wasm.Digest(body)
	var wg sync.WaitGroup
	infos := make([]wasm.ModuleInfo, 8)
	for i := range infos {
		wg.Go(func() {
			var err error
			if infos[i], err = rt.Load(context.Background(), digest, body); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(logs.find("wasm module loaded")); n != 1 {
		t.Fatalf("%d compilations, want 1", n)
	}
	for _, info := range infos[1:] {
		if info != infos[0] {
			t.Fatalf("loads disagree: %+v vs %+v", info, infos[0])
		}
	}
}

// TestCompilationCachePersists: a Runtime fills its cache dir, and a second
// Runtime on the same dir (a restarted host) loads from it. Under -race a
// cold compile of a Go module takes minutes, so the test then uses a tiny
// hand-written module; BenchmarkLoad measures the real thing.
func TestCompilationCachePersists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	ref := `{"delivery_id":"","activation_uid":"","actor_epoch":0,"actor_event_id":0,"revision":0,"agent_uid":"","session_id":""}`
	body := fixedGuest(1, []byte(`{"turn_ref":`+ref+`,"outcome":"ok","messages":[{"role":"assistant","content":"hi"}]}`)).bytes()
	if !raceEnabled {
		_, body = wasmtest.BuildExample(t, wasmtest.Notes)
	}
	load := func() wasm.ModuleInfo {
		rt, err := wasm.New(ctx, wasm.Config{CacheDir: dir}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close(ctx)
		info, err := rt.Validate(ctx, body)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := rt.Instantiate(ctx, info.Digest)
		if err != nil {
			t.Fatal(err)
		}
		defer inst.Close(ctx)
		req := request("count", nil, 1)
		if raceEnabled {
			req.TurnRef = abi.TurnRef{}
		}
		reply(t)(inst.Turn(ctx, req))
		return info
	}
	cold := load()
	var files int
	var size int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	if files == 0 {
		t.Fatal("compilation cache dir is empty after a load")
	}
	warm := load()
	t.Logf("compile cold %s, from cache %s; cache %d files, %d bytes", cold.CompileTime, warm.CompileTime, files, size)
}

// TestRefusedModuleLeavesNoCompiledArtefact: a module refused after it
// compiled (its start traps, or it speaks another ABI version) leaves no
// file in the compilation cache, while an accepted one keeps its artefact
// (issue: refused uploads filled the cache for ever).
func TestRefusedModuleLeavesNoCompiledArtefact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	files := func() []string {
		var out []string
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	if _, err := rt.Validate(ctx, fixedGuest(1, []byte("{}")).bytes()); err != nil {
		t.Fatal(err)
	}
	accepted := files()
	if len(accepted) != 1 {
		t.Fatalf("cache files after one accepted module: %v, want 1", accepted)
	}
	traps := fixedGuest(1, []byte(`{"x":1}`))
	traps.funcs = append(traps.funcs, wfunc{export: "_initialize", body: []byte{opUnreachable}})
	moduleError(t, second(rt.Validate(ctx, traps.bytes())), wasm.ReasonInitFailed, "unreachable")
	moduleError(t, second(rt.Validate(ctx, fixedGuest(2, []byte("{}")).bytes())), wasm.ReasonABIVersion, "v2")
	if got := files(); !slices.Equal(got, accepted) {
		t.Fatalf("cache files after two refused modules: %v, want only the accepted module's %v", got, accepted)
	}
}
