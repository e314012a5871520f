package wasm_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/paddock-dev/paddock/wasm"
)

// cacheFiles counts the files in a compilation cache directory.
func cacheFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestValidateChecksTheHeaderBeforeCompiling: imports and exports are
// checked from the module's header, imports first, and a module refused
// for them is never compiled, so the compilation cache holds nothing of
// it; a module that passes is compiled and cached.
func TestValidateChecksTheHeaderBeforeCompiling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)

	t.Run("unknown import before missing exports", func(t *testing.T) {
		m := wmod{imports: []wimport{{module: "env", name: "foo"}}}
		me := moduleError(t, second(rt.Validate(ctx, m.bytes())), wasm.ReasonBadImports, "env.foo")
		if len(me.Missing) != 0 {
			t.Errorf("Missing = %v; the first fault is the import", me.Missing)
		}
	})
	t.Run("unknown import of a full agent", func(t *testing.T) {
		m := fixedGuest(1, []byte("{}"))
		m.imports = []wimport{{module: "paddock", name: "http_get", params: []byte{tI32}}}
		moduleError(t, second(rt.Validate(ctx, m.bytes())), wasm.ReasonBadImports, "paddock.http_get")
	})
	t.Run("missing exports", func(t *testing.T) {
		m := fixedGuest(1, []byte("{}"))
		m.funcs = m.funcs[:1] // the version only
		me := moduleError(t, second(rt.Validate(ctx, m.bytes())), wasm.ReasonMissingExports, "paddock_alloc", "paddock_free", "paddock_turn")
		if want := []string{"paddock_alloc", "paddock_free", "paddock_turn"}; !slices.Equal(me.Missing, want) {
			t.Errorf("Missing = %v, want %v", me.Missing, want)
		}
	})
	if n := cacheFiles(t, dir); n != 0 {
		t.Fatalf("the compilation cache holds %d files after refused modules only; want none (they were compiled)", n)
	}
	t.Run("a module that passes is compiled and cached", func(t *testing.T) {
		if _, err := rt.Validate(ctx, fixedGuest(1, []byte("{}")).bytes()); err != nil {
			t.Fatal(err)
		}
		if cacheFiles(t, dir) == 0 {
			t.Fatal("the compilation cache is empty after a module was compiled")
		}
	})
}
