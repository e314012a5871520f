package fabric

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// rpcRequest is a worker RPC for the pool.
type rpcRequest struct {
	sess  *session
	fetch wire.FetchModule
}

// rpcLoop serves worker RPCs (module fetches) until the broker closes.
func (b *Broker) rpcLoop() {
	for {
		select {
		case r := <-b.rpc:
			b.serveFetch(r.sess, r.fetch)
		case <-b.ctx.Done():
			return
		}
	}
}

// moduleFetchTimeout bounds one call of BrokerConfig.Modules.
const moduleFetchTimeout = 30 * time.Second

// serveFetch answers FETCH_MODULE with one MODULE chunk or an ERROR.
func (b *Broker) serveFetch(s *session, req wire.FetchModule) {
	fail := func(code, msg string) {
		_ = b.enqueue(s, wire.KindError, wire.Error{RequestID: req.RequestID, Code: code, Message: msg}, nil, false)
	}
	if _, err := workerkind.Of(req.Digest); err != nil || len(req.Digest) != len("sha256:")+64 {
		fail(wire.ErrCodeBadRequest, fmt.Sprintf("%q is not a module digest", req.Digest))
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, moduleFetchTimeout)
	defer cancel()
	mod, err := b.modules.get(ctx, req.Digest)
	if err != nil {
		code := wire.ErrCodeModule
		if errors.Is(err, errNoModules) {
			code = wire.ErrCodeNotFound
		}
		b.log.LogAttrs(ctx, slog.LevelWarn, "fabric module fetch failed", slog.String("worker", s.worker),
			slog.String("digest", req.Digest), slog.String("error", err.Error()))
		fail(code, err.Error())
		return
	}
	if req.Offset < 0 || req.Offset > int64(len(mod)) {
		fail(wire.ErrCodeBadRequest, fmt.Sprintf("offset %d is outside the %d-byte module", req.Offset, len(mod)))
		return
	}
	// base64 grows the chunk by 4/3; keep the message under the limit.
	n := min(max(req.MaxBytes, 1), wire.MaxModuleChunk, (b.cfg.MaxMessageBytes-4096)*3/4)
	end := min(int64(len(mod)), req.Offset+int64(n))
	if err := b.enqueue(s, wire.KindModule, wire.Module{RequestID: req.RequestID, Digest: req.Digest, Offset: req.Offset,
		TotalBytes: int64(len(mod)), Data: mod[req.Offset:end]}, nil, false); err == nil {
		b.st.moduleChunks.Add(1)
	}
}

var errNoModules = errors.New("fabric: this host serves no modules (BrokerConfig.Modules is nil)")

// moduleCache keeps the few modules being fetched, so that a worker's
// chunked fetch reads the store once (single-flight per digest).
type moduleCache struct {
	fetch func(ctx context.Context, digest string) ([]byte, error)

	mu      sync.Mutex
	entries map[string]*modEntry
}

type modEntry struct {
	ready chan struct{}
	bytes []byte
	err   error
	used  time.Time
}

// moduleCacheEntries bounds the modules kept in memory.
const moduleCacheEntries = 4

func (c *moduleCache) get(ctx context.Context, digest string) ([]byte, error) {
	if c.fetch == nil {
		return nil, errNoModules
	}
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]*modEntry{}
	}
	e := c.entries[digest]
	if e == nil {
		if len(c.entries) >= moduleCacheEntries {
			var oldest string
			for d, x := range c.entries {
				if oldest == "" || x.used.Before(c.entries[oldest].used) {
					oldest = d
				}
			}
			delete(c.entries, oldest)
		}
		e = &modEntry{ready: make(chan struct{}), used: time.Now()}
		c.entries[digest] = e
		c.mu.Unlock()
		e.bytes, e.err = c.fetch(ctx, digest)
		if e.err == nil {
			sum := sha256.Sum256(e.bytes)
			if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
				e.err, e.bytes = fmt.Errorf("fabric: module %s: the stored bytes hash to %s", digest, got), nil
			}
		}
		if e.err != nil {
			c.mu.Lock()
			if c.entries[digest] == e {
				delete(c.entries, digest)
			}
			c.mu.Unlock()
		}
		close(e.ready)
		return e.bytes, e.err
	}
	e.used = time.Now()
	c.mu.Unlock()
	select {
	case <-e.ready:
		return e.bytes, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
