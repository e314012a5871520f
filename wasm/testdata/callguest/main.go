//go:build wasip1

// Command callguest is the wasm package's test guest for host calls, a
// reactor built by wasmtest.BuildExample(t, wasmtest.CallGuest). Each
// event message is a command; the reply reports what the call returned:
//
//	http N    one http call to https://example.test/N: "http STATUS LEN ALLX" (ALLX: the body is N bytes of 'x')
//	model     one model call: "model CONTENT STOP_REASON"
//	raw       abi.Call with an http request: "raw seq=S replayed=R error=CODE"
//	loop K    K http calls to https://example.test/0: "loop K"
//	emit K    K text chunks "t0 " … and a tool chunk {"n":K}: "emit K"
//	keep …    keeps the turn's request (the pointer, as an agent may): "kept"
//	kept      the kept request's message, data and turn_ref as they read now
//
// keep and kept are the SDK's aliasing check: the SDK reuses the buffers
// the host frees, so nothing a turn hands the agent may point into them.
// A failed call replies "error CODE". It is a testdata package: go builds it
// when named, and ./... patterns skip it.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(turn) }

// kept is the request a "keep" turn kept; it is the only state the
// module keeps between turns.
var kept *abi.TurnRequest

func main() {}

func turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	cmd, arg, _ := strings.Cut(req.Event.Message, " ")
	var reply string
	switch cmd {
	case "http":
		resp, err := guest.HTTP(ctx, &abi.HTTPRequest{URL: "https://example.test/" + arg})
		if err != nil {
			reply = failure(err)
			break
		}
		n, _ := strconv.Atoi(arg)
		reply = fmt.Sprintf("http %d %d %v", resp.Status, len(resp.Body), bytes.Equal(resp.Body, bytes.Repeat([]byte("x"), n)))
	case "model":
		resp, err := guest.Model(ctx, &abi.ModelRequest{Endpoint: "main",
			Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: "hi"}}})
		if err != nil {
			reply = failure(err)
			break
		}
		reply = fmt.Sprintf("model %s %s", resp.Message.Content, resp.StopReason)
	case "raw":
		res := abi.Call(ctx, &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{URL: "https://example.test/0"}})
		code := ""
		if res.Error != nil {
			code = string(res.Error.Code)
		}
		reply = fmt.Sprintf("raw seq=%d replayed=%v error=%s", res.Seq, res.Replayed, code)
	case "loop":
		k, _ := strconv.Atoi(arg)
		for range k {
			if _, err := guest.HTTP(ctx, &abi.HTTPRequest{URL: "https://example.test/0"}); err != nil {
				reply = failure(err)
				break
			}
		}
		if reply == "" {
			reply = "loop " + arg
		}
	case "emit":
		k, _ := strconv.Atoi(arg)
		reply = "emit " + arg
		for i := range k {
			if err := guest.Emit(ctx, fmt.Sprintf("t%d ", i)); err != nil {
				reply = failure(err)
				break
			}
		}
		if err := guest.EmitJSON(ctx, abi.ChunkTool, map[string]int{"n": k}); err != nil {
			reply = failure(err)
		}
	case "keep":
		kept = req
		reply = "kept"
	case "kept":
		if kept == nil {
			return nil, errors.New("nothing kept")
		}
		reply = fmt.Sprintf("%s|%s|%s|%s", kept.Event.Message, kept.Event.Data, kept.TurnRef.DeliveryID, kept.Session.AgentName)
	default:
		return nil, fmt.Errorf("unknown command %q", req.Event.Message)
	}
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}}, nil
}

// failure renders a call's error as "error CODE".
func failure(err error) string {
	var ce *abi.CallError
	if errors.As(err, &ce) {
		return "error " + string(ce.Code)
	}
	return "error " + err.Error()
}
