package host

import (
	"context"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// The host's side of the session stream and waits that is not a turn's:
// waking the stream's subscribers, expiring waits with the alarm scan, and
// compacting old frames (docs/DESIGN.md "The session stream", "Waits and
// approvals").

// notifyStream tells Options.StreamNotify that key's stream got frames.
func (h *Host) notifyStream(key store.ActorKey) {
	if h.streamNotify != nil {
		h.streamNotify(key)
	}
}

// expireWaits expires the waits whose timeout passed (each once, decided
// by the store: a wait.expired event, or an approval's held event
// released) and wakes their sessions, as fireAlarms does for alarms.
func (h *Host) expireWaits(ctx context.Context) {
	const batch = 64
	for range 64 {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		keys, err := h.st.ExpireDueWaits(sctx, batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("waits: expire due waits", "err", err)
			}
			return
		}
		h.metrics.WaitsExpired.Add(float64(len(keys)))
		for _, k := range keys {
			h.notifyStream(k) // wait.resolved (expired)
			h.Ensure(k)
		}
		if len(keys) < batch {
			return
		}
	}
}

// compactInterval paces compactLoop.
const compactInterval = time.Minute

// compactLoop deletes stream frames older than the retention every
// minute (store.CompactStream keeps those of open events), in batches.
func (h *Host) compactLoop(ctx context.Context) {
	t := time.NewTicker(compactInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.compactStreams(ctx)
	}
}

// compactStreams runs one compaction pass.
func (h *Host) compactStreams(ctx context.Context) {
	const batch = 1000
	before := time.Now().Add(-h.set.Stream.Retention)
	for range 100 {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := h.st.CompactStream(sctx, store.CompactStreamParams{Before: before, Limit: batch})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("stream: compact", "err", err)
			}
			return
		}
		if n < batch {
			return
		}
	}
}
