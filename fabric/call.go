package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// The request lane (abi/FABRIC.md "The request lane"): a worker's turn
// makes a host call with CALL; the broker answers it through the
// abi.Caller of the ctx the turn's Instance.Turn runs under and sends the
// CallResult back in CALL_RESULT, whole or in chunks.

// routeCall handles an authentic CALL of a live session (receive
// goroutine: it decodes the envelope and never blocks). A CALL for a
// delivery not in flight on s is answered cancelled and counted (NoTurn);
// one above MaxCallsInFlight is answered denied and counted (Flood).
func (b *Broker) routeCall(s *session, body []byte) {
	var m wire.Call
	if json.Unmarshal(body, &m) != nil || m.CallID == 0 || m.DeliveryID == "" {
		b.st.malformed.Add(1)
		return
	}
	b.mu.Lock()
	c := s.turns[m.DeliveryID]
	over := c != nil && s.calls >= b.cfg.MaxCallsInFlight
	if c != nil && !over {
		s.calls++
	}
	b.mu.Unlock()
	refuse := func(code abi.CallErrorCode, msg string) {
		// Receive goroutine: one attempt, no retry (a full queue is
		// counted there, and the worker's session is in trouble anyway).
		res, _ := abi.Marshal(&abi.CallResult{Error: &abi.CallError{Code: code, Message: msg}})
		_ = b.enqueue(s, wire.KindCallResult, wire.CallResult{DeliveryID: m.DeliveryID, CallID: m.CallID, Result: res, Last: true}, nil, false)
	}
	switch {
	case c == nil:
		b.st.noTurn.Add(1)
		refuse(abi.CallCancelled, "the turn of delivery "+truncate(m.DeliveryID, 64)+" is not in flight on this session")
		return
	case over:
		b.st.flood.Add(1)
		refuse(abi.CallDenied, fmt.Sprintf("more than %d host calls of this worker session in flight", b.cfg.MaxCallsInFlight))
		return
	}
	go b.serveCall(s, c, m)
}

// serveCall answers one CALL under the turn's ctx (c.ctx: the ctx of its
// Instance.Turn, ended when the turn ends) and sends the result. The
// call's slot is freed once the result was handed to the socket (or could
// not be), so that the broker holds at most MaxCallsInFlight results per
// session.
func (b *Broker) serveCall(s *session, c *call, m wire.Call) {
	defer func() {
		b.mu.Lock()
		s.calls--
		b.mu.Unlock()
	}()
	var res *abi.CallResult
	req := new(abi.CallRequest)
	switch err := json.Unmarshal(m.Request, req); {
	case len(m.Request) > abi.MaxCallRequestBytes:
		res = &abi.CallResult{Error: &abi.CallError{Code: abi.CallTooLarge,
			Message: fmt.Sprintf("call request is %d bytes, limit %d", len(m.Request), abi.MaxCallRequestBytes)}}
	case err != nil:
		res = &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: "call request does not decode: " + err.Error()}}
	default:
		res = abi.Call(c.ctx, req)
		b.st.hostCalls.Add(1)
	}
	out, err := abi.Marshal(res)
	if err == nil && len(out) > abi.MaxCallResultBytes {
		out, err = abi.Marshal(&abi.CallResult{Seq: res.Seq, Error: &abi.CallError{Code: abi.CallTooLarge,
			Message: fmt.Sprintf("call result is %d bytes, limit %d", len(out), abi.MaxCallResultBytes)}})
	}
	if err != nil {
		b.log.LogAttrs(b.ctx, slog.LevelError, "fabric host call result not encodable", slog.String("error", err.Error()))
		return
	}
	if err := b.sendCallResult(c.ctx, s, m, out); err != nil {
		b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric call result not sent; the worker's call ends with its turn",
			slog.String("worker", s.worker), slog.String("delivery_id", m.DeliveryID), slog.String("error", err.Error()))
	}
}

// callChunk is the size of a CALL_RESULT chunk under the broker's message
// limit: base64 grows data by 4/3, and the envelope needs room.
func (b *Broker) callChunk() int {
	return min(wire.MaxCallResultChunk, (b.cfg.MaxMessageBytes-4096)*3/4)
}

// sendCallResult sends res (a CallResult's JSON) for call m: whole when
// it fits one chunk, else in chunks, one after the other (each waits for
// the previous to leave, so that a long result neither fills the
// session's queue nor bypasses its flow-control window). When ctx (the
// turn's) ends between chunks, a whole cancelled result with last set
// ends the call instead: the worker frees the call's slot on the message
// marked last, so every CALL gets one while the session lives.
func (b *Broker) sendCallResult(ctx context.Context, s *session, m wire.Call, res []byte) error {
	chunk := b.callChunk()
	if len(res) <= chunk {
		return b.sendFinal(s, m, res)
	}
	done := make(chan error, 1)
	for off := 0; off < len(res); off += chunk {
		end := min(len(res), off+chunk)
		msg := wire.CallResult{DeliveryID: m.DeliveryID, CallID: m.CallID, Offset: int64(off), TotalBytes: int64(len(res)),
			Data: res[off:end], Last: end == len(res)}
		if err := b.enqueue(s, wire.KindCallResult, msg, done, false); err != nil {
			return err
		}
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			b.st.callChunks.Add(1)
		case <-ctx.Done():
			cancelled, _ := abi.Marshal(&abi.CallResult{Error: &abi.CallError{Code: abi.CallCancelled,
				Message: "the turn ended while its call result was being sent"}})
			if err := b.sendFinal(s, m, cancelled); err != nil {
				return err
			}
			return fmt.Errorf("fabric: call result cut at chunk %d of %d bytes: %w", off, len(res), ctx.Err())
		}
	}
	return nil
}

// sendFinal queues a whole CallResult for call m, marked last. A full
// session queue is retried for up to SendTimeout: a result lost there
// would hold one of the worker's call slots until the session ends.
func (b *Broker) sendFinal(s *session, m wire.Call, res []byte) error {
	msg := wire.CallResult{DeliveryID: m.DeliveryID, CallID: m.CallID, Result: res, Last: true}
	deadline := time.Now().Add(b.cfg.SendTimeout)
	for {
		err := b.enqueue(s, wire.KindCallResult, msg, nil, false)
		if !errors.Is(err, ErrQueueFull) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-s.dead:
			return err
		case <-b.ctx.Done():
			return err
		}
	}
}
