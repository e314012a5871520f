package wasm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestEvictNewSparesFilesBeingWritten: eviction removes the artefacts that
// appeared since the snapshot, but not a "*.tmp" file — a compilation of
// another Runtime or process sharing the directory that is still writing
// (wazero renames it into place; removing it would fail that compilation)
// — nor what was there before.
func TestEvictNewSparesFilesBeingWritten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := New(ctx, Config{CacheDir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	sub := filepath.Join(dir, "wazero-test")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string) string {
		p := filepath.Join(sub, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := write("aaaa")
	before := r.cacheFiles()
	refused := write("bbbb")
	inFlight := write("cccc.123456.tmp")
	r.evict(r.newFiles(before))
	for p, want := range map[string]bool{old: true, refused: false, inFlight: true} {
		_, err := os.Stat(p)
		if got := err == nil; got != want {
			t.Errorf("%s exists = %v after eviction, want %v", filepath.Base(p), got, want)
		}
	}
}
