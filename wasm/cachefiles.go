package wasm

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// cacheFiles lists the regular files under the compilation cache dir (the
// compiled artefacts, in wazero's per-version subdirectory). nil without a
// CacheDir or when it cannot be read: eviction is then skipped, never
// guessed.
func (r *Runtime) cacheFiles() map[string]bool {
	if r.cfg.CacheDir == "" {
		return nil
	}
	files := map[string]bool{}
	err := filepath.WalkDir(r.cfg.CacheDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files[p] = true
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return files
}

// newFiles lists the cache files that are not in before: the artefacts
// a compilation made (nil without a cache). The caller holds compileMu, so
// no other compilation of this Runtime wrote one meanwhile. Files still
// being written ("*.tmp": wazero writes a temp file and renames it) are
// left out: they belong to a compilation in another Runtime or process
// sharing the directory, whose rename would fail, and with it that
// compilation, if the file vanished.
func (r *Runtime) newFiles(before map[string]bool) []string {
	if before == nil {
		return nil
	}
	var made []string
	for p := range r.cacheFiles() {
		if !before[p] && !strings.HasSuffix(p, ".tmp") {
			made = append(made, p)
		}
	}
	return made
}

// evict removes the cache files made for a module refused after compiling
// (its start failed, or it speaks another ABI version), which would
// otherwise stay in the cache for ever (wazero's CompilationCache has no
// per-module delete). A finished artefact of another process's
// compilation listed here costs it only a recompile on its next cold
// load.
func (r *Runtime) evict(made []string) {
	for _, p := range made {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			r.log.Warn("wasm: evict a refused module's compiled artefact", "path", p, "err", err)
		}
	}
}
