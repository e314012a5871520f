package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/wasm"
)

// errModule is wrapped by module fetch and cache failures (ERROR code
// module_unavailable).
var errModule = errors.New("fabric: module unavailable")

// fetchTimeout bounds the wait for one MODULE chunk.
const fetchTimeout = 30 * time.Second

// ensureModule makes the module of digest loaded in the worker's wasm
// runtime: from the runtime itself, else from the disk cache (verified by
// sha256), else fetched from the host in chunks over c and cached. One
// fetch per digest at a time.
func (w *worker) ensureModule(ctx context.Context, c *conn, digest string) error {
	for {
		if w.rt.Loaded(digest) {
			return nil
		}
		w.modMu.Lock()
		wait, busy := w.modules[digest]
		if !busy {
			wait = make(chan struct{})
			w.modules[digest] = wait
		}
		w.modMu.Unlock()
		if busy {
			select {
			case <-wait:
				continue // loaded, or failed: look again
			case <-ctx.Done():
				return fmt.Errorf("%w: waiting for %s: %w", errModule, digest, ctx.Err())
			}
		}
		err := w.loadModule(ctx, c, digest)
		w.modMu.Lock()
		delete(w.modules, digest)
		close(wait)
		w.modMu.Unlock()
		return err
	}
}

// modulePath is where the module of digest is cached on disk.
func (w *worker) modulePath(digest string) string {
	return filepath.Join(w.cfg.CacheDir, "modules", strings.TrimPrefix(digest, "sha256:")+".wasm")
}

func (w *worker) loadModule(ctx context.Context, c *conn, digest string) error {
	path := w.modulePath(digest)
	if b, err := os.ReadFile(path); err == nil {
		if wasm.Digest(b) == digest {
			if _, err := w.rt.Load(ctx, digest, b); err != nil {
				return fmt.Errorf("%w: %s: %w", errModule, digest, err)
			}
			return nil
		}
		_ = os.Remove(path) // corrupted or tampered with: fetch again
	}
	b, err := c.fetchModule(ctx, digest, w.rt.Config().MaxModuleBytes)
	if err != nil {
		return err
	}
	if got := wasm.Digest(b); got != digest {
		return fmt.Errorf("%w: %s: the host sent bytes that hash to %s", errModule, digest, got)
	}
	if err := writeFileAtomic(path, b); err != nil {
		return fmt.Errorf("%w: cache %s: %w", errModule, digest, err)
	}
	if _, err := w.rt.Load(ctx, digest, b); err != nil {
		return fmt.Errorf("%w: %s: %w", errModule, digest, err)
	}
	return nil
}

// fetchModule reads a module from the host, chunk by chunk.
func (c *conn) fetchModule(ctx context.Context, digest string, limit int) ([]byte, error) {
	var buf []byte
	for {
		c.mu.Lock()
		c.nextReq++
		id := c.nextReq
		ch := make(chan fetchReply, 1)
		c.waiters[id] = ch
		c.mu.Unlock()
		forget := func() {
			c.mu.Lock()
			delete(c.waiters, id)
			c.mu.Unlock()
		}
		if err := c.send(wire.KindFetchModule, wire.FetchModule{RequestID: id, Digest: digest, Offset: int64(len(buf)), MaxBytes: wire.MaxModuleChunk}); err != nil {
			forget()
			return nil, fmt.Errorf("%w: %s: %w", errModule, digest, err)
		}
		t := time.NewTimer(fetchTimeout)
		var r fetchReply
		select {
		case r = <-ch:
			t.Stop()
		case <-t.C:
			forget()
			return nil, fmt.Errorf("%w: %s: no answer within %s", errModule, digest, fetchTimeout)
		case <-ctx.Done():
			t.Stop()
			forget()
			return nil, fmt.Errorf("%w: %s: %w", errModule, digest, ctx.Err())
		case <-c.ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: %s: %w", errModule, digest, context.Cause(c.ctx))
		}
		if r.kind == wire.KindError {
			var e wire.Error
			_ = json.Unmarshal(r.body, &e)
			return nil, fmt.Errorf("%w: %s: host: %s: %s", errModule, digest, e.Code, e.Message)
		}
		m := new(wire.Module)
		if err := json.Unmarshal(r.body, m); err != nil {
			return nil, fmt.Errorf("%w: %s: malformed MODULE: %w", errModule, digest, err)
		}
		switch {
		case m.Digest != digest || m.Offset != int64(len(buf)):
			return nil, fmt.Errorf("%w: %s: the host answered with %s at offset %d", errModule, digest, m.Digest, m.Offset)
		case m.TotalBytes < 0 || m.TotalBytes > int64(limit):
			return nil, fmt.Errorf("%w: %s: %d bytes, limit %d", errModule, digest, m.TotalBytes, limit)
		case len(m.Data) == 0 && int64(len(buf)) < m.TotalBytes:
			return nil, fmt.Errorf("%w: %s: empty chunk at offset %d of %d", errModule, digest, len(buf), m.TotalBytes)
		}
		if buf == nil {
			buf = make([]byte, 0, m.TotalBytes)
		}
		buf = append(buf, m.Data...)
		if int64(len(buf)) >= m.TotalBytes {
			return buf[:m.TotalBytes], nil
		}
	}
}

// writeFileAtomic writes b to path through a temporary file and rename.
func writeFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
