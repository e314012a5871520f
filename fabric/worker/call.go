package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// The request lane, worker side (abi/FABRIC.md "The request lane"): each
// turn runs under a ctx whose abi.Caller sends its host calls as CALL and
// waits for their CALL_RESULT.

// pendingCall is a CALL waiting for its CALL_RESULT. The session loop
// routes the result's messages into parts (never blocking: a host that
// sends more than a result's worth of chunks loses the excess); the
// calling goroutine decodes them.
type pendingCall struct {
	parts chan []byte
}

// callParts is how many CALL_RESULT messages one result may take under
// the session's message limit, plus slack.
func (c *conn) callParts() int {
	return abi.MaxCallResultBytes/c.callChunk() + 2
}

// callChunk is the host's chunk size for the session's message limit (the
// broker's rule: at most wire.MaxCallResultChunk, base64 and envelope
// within max_message_bytes).
func (c *conn) callChunk() int {
	return max(1, min(wire.MaxCallResultChunk, (c.maxMessage-4096)*3/4))
}

// hostCaller is the abi.Caller of one turn running on the worker.
type hostCaller struct {
	c          *conn
	deliveryID string
}

// Call sends req to the host as a CALL of the turn and waits for the
// CALL_RESULT, ctx's end (timeout or cancelled) or the session's loss
// (cancelled: the turn's ctx derives from the session's). A host without
// the request lane gets no CALL: the call answers not_configured. At most
// the host's max_calls_in_flight calls of the session are in flight; more
// wait for a slot.
func (h hostCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	c := h.c
	if c.callSlots == nil {
		return abi.NoCaller()
	}
	if req == nil {
		return callErr(abi.CallInvalid, "call request is null")
	}
	body, err := abi.Marshal(req)
	if err != nil {
		return callErr(abi.CallInvalid, "encode call request: "+err.Error())
	}
	if len(body) > abi.MaxCallRequestBytes {
		return callErr(abi.CallTooLarge, fmt.Sprintf("call request is %d bytes, limit %d", len(body), abi.MaxCallRequestBytes))
	}
	if n := len(body) + len(h.deliveryID) + 128 + wire.MinMessageLen; n > c.maxMessage {
		return callErr(abi.CallTooLarge, fmt.Sprintf("the CALL would be %d bytes; the host's message limit is %d", n, c.maxMessage))
	}
	if ctx.Err() != nil {
		return ctxResult(ctx)
	}
	select {
	case c.callSlots <- struct{}{}:
	case <-ctx.Done():
		return ctxResult(ctx)
	}
	p := &pendingCall{parts: make(chan []byte, c.callParts())}
	c.mu.Lock()
	c.nextCall++
	id := c.nextCall
	c.calls[id] = p
	c.mu.Unlock()
	if err := c.send(wire.KindCall, wire.Call{DeliveryID: h.deliveryID, CallID: id, Request: body}); err != nil {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
		<-c.callSlots
		return callErr(abi.CallCancelled, "the call could not be sent to the host: "+err.Error())
	}
	// The slot is freed by the session loop when the last part arrives,
	// also if this goroutine stopped waiting: the host is still answering.
	var buf []byte
	for {
		select {
		case part := <-p.parts:
			res, done, err := addPart(&buf, part)
			if err != nil {
				c.w.log.LogAttrs(ctx, slog.LevelWarn, "fabric worker: bad CALL_RESULT", slog.String("error", err.Error()))
				return callErr(abi.CallUpstream, "the host's call result is malformed: "+err.Error())
			}
			if done {
				return res
			}
		case <-ctx.Done():
			return ctxResult(ctx)
		}
	}
}

// addPart applies one CALL_RESULT message to buf; done when the result is
// complete.
func addPart(buf *[]byte, body []byte) (*abi.CallResult, bool, error) {
	var m wire.CallResult
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, false, fmt.Errorf("CALL_RESULT does not decode: %w", err)
	}
	whole := m.Result
	if whole == nil {
		if m.Offset != int64(len(*buf)) || m.TotalBytes > abi.MaxCallResultBytes || int64(len(*buf)+len(m.Data)) > m.TotalBytes {
			return nil, false, fmt.Errorf("chunk at %d of %d (%d bytes) does not follow the %d bytes received", m.Offset, m.TotalBytes, len(m.Data), len(*buf))
		}
		*buf = append(*buf, m.Data...)
		if !m.Last {
			return nil, false, nil
		}
		if int64(len(*buf)) != m.TotalBytes {
			return nil, false, fmt.Errorf("last chunk ends at %d of %d bytes", len(*buf), m.TotalBytes)
		}
		whole = *buf
	}
	res := new(abi.CallResult)
	if err := json.Unmarshal(whole, res); err != nil {
		return nil, false, fmt.Errorf("call result does not decode: %w", err)
	}
	return res, true, nil
}

// routeCallResult hands a CALL_RESULT to its waiting call (session loop:
// it decodes only the envelope and never blocks).
func (c *conn) routeCallResult(body []byte) {
	var env struct {
		CallID uint64 `json:"call_id"`
		Last   bool   `json:"last"`
	}
	if json.Unmarshal(body, &env) != nil || env.CallID == 0 {
		return
	}
	c.mu.Lock()
	p := c.calls[env.CallID]
	if p != nil && env.Last {
		delete(c.calls, env.CallID)
	}
	c.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case p.parts <- body:
	default: // more parts than a result can have: the call fails on its turn's end
	}
	if env.Last {
		<-c.callSlots
	}
}

func callErr(code abi.CallErrorCode, msg string) *abi.CallResult {
	return &abi.CallResult{Error: &abi.CallError{Code: code, Message: msg}}
}

// ctxResult is the result of a call whose ctx ended first: timeout for a
// deadline, else cancelled (the turn was cancelled, or the session lost).
func ctxResult(ctx context.Context) *abi.CallResult {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return callErr(abi.CallTimeout, "the turn's deadline passed during the call")
	}
	return callErr(abi.CallCancelled, "the call was cancelled: "+context.Cause(ctx).Error())
}
