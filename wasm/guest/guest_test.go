//go:build !wasip1

package guest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

// callerFunc adapts a function to abi.Caller.
type callerFunc func(context.Context, *abi.CallRequest) *abi.CallResult

func (f callerFunc) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	return f(ctx, req)
}

// TestHTTPAndModelOutsideWasm: on the developer's machine HTTP and Model
// use the Caller a test harness put in ctx, and answer not_configured
// without one, exactly as abi.CallHTTP and abi.CallModel.
func TestHTTPAndModelOutsideWasm(t *testing.T) {
	var got []*abi.CallRequest
	ctx := abi.WithCaller(context.Background(), callerFunc(func(_ context.Context, req *abi.CallRequest) *abi.CallResult {
		got = append(got, req)
		if req.Kind == abi.CallKindModel {
			return &abi.CallResult{Seq: 2, Model: &abi.ModelResponse{Message: abi.ModelMessage{Role: abi.RoleAssistant, Content: "hi"}}}
		}
		return &abi.CallResult{Seq: 1, HTTP: &abi.HTTPResponse{Status: 200, Body: []byte("ok")}}
	}))
	resp, err := guest.HTTP(ctx, &abi.HTTPRequest{URL: "https://example.test/"})
	if err != nil || resp.Status != 200 || string(resp.Body) != "ok" {
		t.Fatalf("HTTP: %+v, %v", resp, err)
	}
	reply, err := guest.Model(ctx, &abi.ModelRequest{Endpoint: "main", Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: "hi"}}})
	if err != nil || reply.Message.Content != "hi" {
		t.Fatalf("Model: %+v, %v", reply, err)
	}
	if len(got) != 2 || got[0].Kind != abi.CallKindHTTP || got[1].Model.Endpoint != "main" {
		t.Fatalf("the Caller got %+v", got)
	}

	var ce *abi.CallError
	if _, err := guest.HTTP(context.Background(), &abi.HTTPRequest{URL: "https://example.test/"}); !errors.As(err, &ce) || ce.Code != abi.CallNotConfigured {
		t.Fatalf("HTTP without a Caller: %v, want not_configured", err)
	}
	if _, err := guest.Model(context.Background(), &abi.ModelRequest{Endpoint: "main"}); !errors.As(err, &ce) || ce.Code != abi.CallNotConfigured {
		t.Fatalf("Model without a Caller: %v, want not_configured", err)
	}
}
