// Package wire is the plugin worker protocol shared by the host side
// (pluginhost.Manager) and the plugin side (plugins.Serve): the go-plugin
// handshake, the hand-written gRPC service that carries turns, and the
// frames exchanged on its stream. See the plugins package documentation for
// the protocol as a plugin author in another language sees it.
//
// No protoc is involved: the service is a grpc.ServiceDesc written by hand
// and every message is a google.protobuf.BytesValue whose value is one
// Frame encoded as JSON, so the abi v1 JSON travels unchanged inside it.
package wire

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/paddock-dev/paddock/abi"
)

// Handshake constants. The cookie is a fixed UX guard (it stops the binary
// from being run by hand), not a secret; the ABI major version travels in
// HandshakeConfig.ProtocolVersion so that a mismatch is refused at start.
const (
	MagicCookieKey   = "PADDOCK_PLUGIN_COOKIE"
	MagicCookieValue = "3d0c7a5e-paddock-turn-worker"
)

// TraceparentKey is the gRPC metadata key of a Turn stream that carries
// the W3C traceparent of the host's turn attempt span (docs/DESIGN.md
// "Tracing"); absent when the turn has none.
const TraceparentKey = "traceparent"

// PluginName is the name under which the turn service is dispensed.
const PluginName = "turn"

// ServiceName and TurnMethod name the gRPC service and its one method.
const (
	ServiceName = "paddock.plugin.v1.TurnWorker"
	TurnMethod  = "/" + ServiceName + "/Turn"
)

// MaxFrameBytes bounds one encoded frame in either direction: an abi
// request or result (4 MiB each), a host-call request (4 MiB) or a
// host-call result (abi.MaxCallResultBytes, 8 MiB), plus the envelope.
const MaxFrameBytes = abi.MaxCallResultBytes + 1<<20

// MaxCallsInFlight bounds the host calls one turn has sent and not yet
// had answered. The SDK waits for a free slot before sending; the host
// answers a call above the bound at once with a denied error.
const MaxCallsInFlight = 16

// Frame types. Host → plugin: TypeRequest (first frame, exactly once),
// TypeSteer (any number), TypeCallResult (one per call), TypeCancel (at
// most once). Plugin → host: TypeAccepted (first), TypeSteerTaken (one per
// steer taken in), TypeCall (host calls, any number while the turn runs),
// TypeResult (last).
const (
	TypeRequest    = "request"
	TypeSteer      = "steer"
	TypeCancel     = "cancel"
	TypeAccepted   = "accepted"
	TypeSteerTaken = "steer_taken"
	TypeResult     = "result"
	TypeCall       = "call"
	TypeCallResult = "call_result"
)

// Frame is one message of the Turn stream. Body is abi v1 JSON: a
// TurnRequest, a Steer, a TurnRef (steer_taken), a TurnResult, a CallBody
// (call) or a CallResultBody (call_result); absent for accepted and
// cancel.
type Frame struct {
	Type string          `json:"type"`
	Body json.RawMessage `json:"body,omitempty"`
	// Calls is set on the request frame by a host that answers host calls
	// on this stream. A plugin whose request frame lacks it answers every
	// host call itself with abi.NoCaller (an older host would never
	// answer).
	Calls bool `json:"calls,omitempty"`
}

// CallBody is the body of a call frame: a host call of the turn, numbered
// by the plugin (ID ≥ 1, unique within the stream).
type CallBody struct {
	// ID numbers the call within the stream.
	ID uint64 `json:"id"`
	// Request is the abi CallRequest JSON.
	Request json.RawMessage `json:"request"`
}

// CallResultBody is the body of a call_result frame: the answer to call
// ID.
type CallResultBody struct {
	// ID is the call's (CallBody.ID).
	ID uint64 `json:"id"`
	// Result is the abi CallResult JSON.
	Result json.RawMessage `json:"result"`
}

// Encode returns the BytesValue carrying a frame of type typ with body v
// (nil for none).
func Encode(typ string, v any) (*wrapperspb.BytesValue, error) {
	return EncodeFrame(Frame{Type: typ}, v)
}

// EncodeFrame is Encode for a frame whose other fields (Calls) are set:
// f.Body is replaced by v's encoding.
func EncodeFrame(f Frame, v any) (*wrapperspb.BytesValue, error) {
	typ := f.Type
	if v != nil {
		b, err := abi.Marshal(v) // no HTML escaping: sizes as on every other path
		if err != nil {
			return nil, fmt.Errorf("encode %s frame: %w", typ, err)
		}
		f.Body = b
	}
	b, err := abi.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode %s frame: %w", typ, err)
	}
	return wrapperspb.Bytes(b), nil
}

// Decode parses the frame carried by m.
func Decode(m *wrapperspb.BytesValue) (Frame, error) {
	var f Frame
	if err := json.Unmarshal(m.GetValue(), &f); err != nil {
		return Frame{}, fmt.Errorf("decode frame: %w", err)
	}
	if f.Type == "" {
		return Frame{}, fmt.Errorf("decode frame: no type")
	}
	return f, nil
}

// Handshake returns the go-plugin handshake for ABI major version.
func Handshake(version int) plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  uint(version),
		MagicCookieKey:   MagicCookieKey,
		MagicCookieValue: MagicCookieValue,
	}
}

// TurnServer is implemented by the plugin side: Turn serves one Turn
// stream.
type TurnServer interface {
	Turn(stream grpc.ServerStream) error
}

// ServiceDesc returns the hand-written description of the TurnWorker
// service, served by srv.
func ServiceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: ServiceName,
		HandlerType: (*TurnServer)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Turn",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(srv any, stream grpc.ServerStream) error {
				return srv.(TurnServer).Turn(stream)
			},
		}},
		Metadata: "paddock/plugin/v1 (hand-written, BytesValue frames)",
	}
}

// NewTurnStream opens a Turn stream on conn; ctx governs the stream's whole
// life.
func NewTurnStream(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, error) {
	return conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Turn", ServerStreams: true, ClientStreams: true},
		TurnMethod, grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes))
}

// Plugin is the go-plugin GRPCPlugin of the turn service: on the plugin
// side it registers Server; on the host side it dispenses the
// *grpc.ClientConn on which NewTurnStream opens turns.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Turns serves turns (plugin side only).
	Turns TurnServer
}

// GRPCServer registers the turn service.
func (p *Plugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(ServiceDesc(), p.Turns)
	return nil
}

// GRPCClient returns conn itself.
func (p *Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return conn, nil
}
