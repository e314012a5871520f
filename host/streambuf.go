package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Stream buffer sizes.
const (
	// streamFlushBytes: a buffer holding this many bytes of chunk text and
	// data is written at once, without waiting for the flush interval.
	streamFlushBytes = 32 << 10
	// streamFrameBytes and streamFrameChunks bound one AppendChunks frame
	// (raw text and data bytes; JSON escaping may grow text up to six
	// times, which still fits store.MaxChunkFrameBytes).
	streamFrameBytes  = 128 << 10
	streamFrameChunks = 1024
	// streamWriteTimeout bounds one AppendChunks.
	streamWriteTimeout = 10 * time.Second
	// streamChunkCost is the least a chunk counts towards
	// stream.max_bytes_per_turn (its text and data bytes when more): a
	// chunk costs its frame's JSON and an SSE event for every client even
	// when it is empty, so a flood of empty or tiny chunks reaches the cap
	// too.
	streamChunkCost = 64
)

// streamBuf buffers the chunks one attempt emits (abi/README.md "Emit")
// and writes them to the session stream in batches: one AppendChunks
// frame when the flush interval has passed since the last write, or at
// once when streamFlushBytes are buffered, and whatever is left when the
// attempt ends (end, before its CommitTurn or FailAttempt, so that chunk
// frames precede turn.committed). The attempt's offsets run from 0 in the
// order emits arrive. At most one write is in flight. A *store.FenceError
// stops the buffer: the attempt is stale, and its later emits answer
// cancelled, as do emits after end — except stale_revision, which only
// says a steer raised the revision before the controller handed the
// buffer the new turn_ref (setRef): the chunks wait for it. A steer's
// rerun of the turn goes on in the same buffer and the same attempt
// (restart): if the first run streamed a chunk frame, the stream says
// that output is void — turn.retrying with reason steer and turn.started,
// one RestartStream, written before any chunk of the rerun — and the
// rerun's offsets start at 0 again, so what the rerun emits again (the
// agent's chunks, a replayed model call's text) is not mistaken for new
// output: a client drops the event's chunks at turn.retrying.
type streamBuf struct {
	h        *Host
	key      store.ActorKey
	attempt  int
	interval time.Duration
	maxBytes int64
	log      *slog.Logger

	writeMu sync.Mutex // one AppendChunks at a time, in offset order

	mu      sync.Mutex
	ref     abi.TurnRef // the attempt's newest turn_ref (a steer raises it)
	pending []abi.Chunk
	pendBy  int       // text and data bytes in pending
	first   int       // offset of pending[0]
	used    int64     // bytes accepted this attempt
	last    time.Time // last write (or the buffer's start)
	timer   *time.Timer
	kicked  bool // a write for the size threshold is on its way
	ended   bool // end was called: later emits answer cancelled
	fenced  bool // a write was refused by the fences
	// stale: a write was refused as stale_revision — a steer raised the
	// delivery's revision before the controller gave this buffer the new
	// turn_ref. The attempt is not over: its chunks stay pending, and
	// setRef or restart writes them under the newer ref.
	stale bool
	// wrote: a chunk frame of this run of the turn is stored (a steer's
	// rerun then restarts the stream).
	wrote bool
	// restartDue: the rerun's turn.retrying and turn.started are not
	// written yet; no chunk is written before them (flush).
	restartDue bool
	// promote, when set, makes a deferred turn written (promotion.ensure)
	// before its first chunk frame.
	promote func(context.Context) error
}

// newStreamBuf returns the stream buffer of the attempt whose first
// delivery is ref.
func newStreamBuf(h *Host, key store.ActorKey, ref abi.TurnRef, attempt int, log *slog.Logger) *streamBuf {
	sp := h.set.Stream
	return &streamBuf{h: h, key: key, attempt: attempt, ref: ref, interval: sp.FlushInterval, maxBytes: sp.MaxBytesPerTurn,
		log: log, last: time.Now()}
}

// setRef makes ref the turn_ref later writes are fenced by (after a steer).
func (b *streamBuf) setRef(ref abi.TurnRef) {
	b.mu.Lock()
	b.ref = ref
	kick := b.unstaleLocked()
	b.mu.Unlock()
	if kick {
		go b.flush()
	}
}

// unstaleLocked clears stale after the ref changed, and says whether
// chunks or a restart wait for a write.
func (b *streamBuf) unstaleLocked() bool {
	if !b.stale {
		return false
	}
	b.stale = false
	return len(b.pending) > 0 || b.restartDue
}

// emit adds an agent's chunk (already validated) and answers the emit
// call at once: {"seq":0}, or too_large past the per-turn cap, or
// cancelled once the attempt ended or lost its fence.
func (b *streamBuf) emit(c abi.Chunk) *abi.CallResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.ended:
		return cancelled("the turn's attempt has ended: its output is complete")
	case b.fenced:
		return cancelled("the attempt lost its fence: its output is not streamed and its turn will not commit")
	}
	n := max(int64(len(c.Text)+len(c.Data)), streamChunkCost)
	if b.used+n > b.maxBytes {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallTooLarge,
			Message: fmt.Sprintf("the turn emitted %d bytes (a chunk counts at least %d); this chunk of %d bytes would pass the limit of %d per turn (stream.max_bytes_per_turn)",
				b.used, streamChunkCost, len(c.Text)+len(c.Data), b.maxBytes)}}
	}
	b.addLocked(c, n)
	return &abi.CallResult{}
}

// emitHost adds a chunk the host makes (a model call's text): text is
// made storable and split to fit abi.MaxChunkBytes. Past the per-turn cap,
// or after end, it is dropped silently.
func (b *streamBuf) emitHost(text string, callSeq int) {
	if text == "" {
		return
	}
	text = abi.SafeText(text)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended || b.fenced {
		return
	}
	for text != "" {
		part := text
		if len(part) > abi.MaxChunkBytes {
			cut := abi.MaxChunkBytes
			for cut > 0 && !utf8.RuneStart(part[cut]) {
				cut--
			}
			part = part[:cut]
		}
		text = text[len(part):]
		n := max(int64(len(part)), streamChunkCost)
		if b.used+n > b.maxBytes {
			return
		}
		b.addLocked(abi.Chunk{Type: abi.ChunkText, Text: part, CallSeq: callSeq}, n)
	}
}

// emitReplay adds the text of a model call replayed from the journal. It
// is streamed every time: a replay runs in a later attempt (whose stream
// follows turn.retrying) or in a steer's rerun (whose stream follows the
// restart's turn.retrying, or got none of the first run's output), so a
// client has dropped whatever the call streamed before.
func (b *streamBuf) emitReplay(text string, callSeq int) {
	b.emitHost(text, callSeq)
}

// addLocked appends c (counting n bytes towards the cap) and schedules its
// write.
func (b *streamBuf) addLocked(c abi.Chunk, n int64) {
	b.used += n
	b.pending = append(b.pending, c)
	b.pendBy += len(c.Text) + len(c.Data)
	switch {
	case b.pendBy >= streamFlushBytes:
		if !b.kicked {
			b.kicked = true
			go b.flush()
		}
	case b.timer == nil:
		wait := max(b.interval-time.Since(b.last), 0)
		b.timer = time.AfterFunc(wait, b.flush)
	}
}

// flush writes what is buffered, in frames of at most streamFrameBytes and
// streamFrameChunks. A write that fails for another reason than the fences
// keeps its chunks for the next flush (offsets stay gap-free); end gives
// them one last try.
func (b *streamBuf) flush() {
	b.writeMu.Lock()
	defer b.writeMu.Unlock()
	// Write what is buffered now; chunks emitted meanwhile wait for their
	// own flush interval (a write is the interval's start), so a slow
	// store gets fewer, larger frames rather than back-to-back ones.
	b.mu.Lock()
	upTo := b.first + len(b.pending)
	if b.timer != nil {
		// This flush writes the chunks the timer was for; a timer armed
		// by chunks emitted during the write below is theirs.
		b.timer.Stop()
		b.timer = nil
	}
	b.kicked = false
	b.mu.Unlock()
	for {
		b.mu.Lock()
		if b.restartDue && !b.fenced && !b.stale {
			if !b.writeRestartLocked() {
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
			continue
		}
		if b.first >= upTo || len(b.pending) == 0 || b.fenced || b.stale {
			b.mu.Unlock()
			return
		}
		b.last = time.Now()
		k, by := 0, 0
		for k < len(b.pending) && k < streamFrameChunks && b.first+k < upTo {
			n := len(b.pending[k].Text) + len(b.pending[k].Data)
			if k > 0 && by+n > streamFrameBytes {
				break
			}
			by += n
			k++
		}
		batch := b.pending[:k:k]
		p := store.AppendChunksParams{Ref: b.ref, Attempt: b.attempt, Offset: b.first, Chunks: batch}
		b.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), streamWriteTimeout)
		var err error
		if b.promote != nil {
			// A deferred turn: written first (turn.started precedes its
			// chunks); a refusal is the fences' (the attempt is stale).
			err = b.promote(ctx)
		}
		if err == nil {
			_, err = b.h.st.AppendChunks(ctx, p)
		}
		cancel()

		b.mu.Lock()
		var fe *store.FenceError
		switch {
		case err == nil:
			b.pending = b.pending[k:]
			b.pendBy -= by
			b.first += k
			b.wrote = true
			b.mu.Unlock()
			b.h.metrics.StreamFrames.Inc()
			b.h.notifyStream(b.key)
			continue
		case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision && p.Ref == b.ref:
			// A steer raised the revision and this buffer does not have
			// the new ref yet: keep the chunks for setRef or restart.
			b.stale = true
			b.mu.Unlock()
			b.log.Debug("stream: chunks wait for the steered turn_ref", "chunks", len(b.pending))
			return
		case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision:
			// The ref changed during the write: write again under it.
			b.mu.Unlock()
			continue
		case errors.As(err, &fe):
			b.fenced = true
			b.pending, b.pendBy = nil, 0
			b.mu.Unlock()
			b.log.Info("stream: chunks refused by the fences; the attempt's later emits answer cancelled", "reason", fe.Reason)
			return
		default:
			if b.timer == nil && !b.ended {
				b.last = time.Now()
				b.timer = time.AfterFunc(b.interval, b.flush)
			}
			b.mu.Unlock()
			b.log.Warn("stream: append chunks failed; retrying at the next flush", "chunks", k, "err", err)
			return
		}
	}
}

// end flushes what is left and refuses later emits; the controller calls
// it when the worker's turn returned, before CommitTurn or FailAttempt.
// Chunks a last write could not store are dropped (the stream is best
// effort until the commit, which carries the turn's messages anyway).
func (b *streamBuf) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
	b.flush()
	b.mu.Lock()
	if n := len(b.pending); n > 0 && !b.stale {
		// (Stale chunks are kept: the commit under the old ref will be
		// refused too, and the steer's rerun restarts this buffer.)
		b.log.Warn("stream: chunks not stored before the turn ended; dropped", "chunks", n)
		b.first += n
		b.pending, b.pendBy = nil, 0
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.mu.Unlock()
}

// restart takes emits again after end: the same attempt runs its turn
// again under ref (a steer superseded the revision the worker answered).
// The first run's output is void: chunks it could not store are dropped,
// and if it stored any, the stream says so (turn.retrying with reason
// steer, then turn.started: writeRestartLocked) before the rerun's first
// chunk. The rerun's offsets start at 0 and its bytes count afresh
// against the per-turn cap.
func (b *streamBuf) restart(ref abi.TurnRef) {
	b.writeMu.Lock()
	b.mu.Lock()
	b.ended, b.ref, b.stale = false, ref, false
	if b.wrote {
		b.restartDue = true
	}
	if n := len(b.pending); n > 0 {
		b.log.Debug("stream: the steered run's unstored chunks are dropped", "chunks", n)
	}
	b.wrote = false
	b.pending, b.pendBy, b.first, b.used = nil, 0, 0, 0
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	due := b.restartDue
	b.mu.Unlock()
	b.writeMu.Unlock()
	if due {
		b.flush()
	}
}

// writeRestartLocked writes the restart's frames (RestartStream) with b.mu
// held on entry and exit, released during the write; writeMu is held. It
// says whether flush may go on writing chunks. Refused as stale_revision
// under the newest ref, it waits for setRef like chunks do; another
// failure is retried at the next flush, and the chunks wait behind it.
func (b *streamBuf) writeRestartLocked() bool {
	p := store.RestartStreamParams{Ref: b.ref, Attempt: b.attempt, Reason: store.EndReasonSteer}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), streamWriteTimeout)
	_, err := b.h.st.RestartStream(ctx, p)
	cancel()
	b.mu.Lock()
	var fe *store.FenceError
	switch {
	case err == nil:
		b.restartDue = false
		b.h.notifyStream(b.key)
		return true
	case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision && p.Ref == b.ref:
		b.stale = true
		b.log.Debug("stream: the steer's restart waits for the newer turn_ref")
		return false
	case errors.As(err, &fe) && fe.Reason == store.FenceStaleRevision:
		return true // the ref changed during the write: write again under it
	case errors.As(err, &fe):
		b.fenced = true
		b.pending, b.pendBy = nil, 0
		b.log.Info("stream: the steer's restart refused by the fences; the attempt's later emits answer cancelled", "reason", fe.Reason)
		return false
	default:
		if b.timer == nil && !b.ended {
			b.last = time.Now()
			b.timer = time.AfterFunc(b.interval, b.flush)
		}
		b.log.Warn("stream: restarting the steered turn's stream failed; retrying at the next flush", "err", err)
		return false
	}
}
