package guard

import "sync/atomic"

// Reason names why the guard refused or cut a connection. The values are
// stable strings usable as metric labels.
type Reason string

// Pre-handshake rejection reasons.
const (
	ReasonBadSignature     Reason = "bad_signature"      // greeting bytes 0/9 not 0xFF/0x7F (not ZMTP 2+)
	ReasonBadVersion       Reason = "bad_version"        // greeting major version is not 3
	ReasonBadMechanism     Reason = "bad_mechanism"      // security mechanism is not NULL
	ReasonBadServerFlag    Reason = "bad_server_flag"    // as-server byte not 0 or 1
	ReasonBadReady         Reason = "bad_ready"          // first command missing, not READY, oversized or malformed metadata
	ReasonPeerType         Reason = "peer_type"          // Socket-Type not in Options.PeerSocketTypes
	ReasonDuplicate        Reason = "duplicate_identity" // identity in use and DuplicateReject
	ReasonHandshakeTimeout Reason = "handshake_timeout"  // HandshakeTimeout expired
	ReasonHandshakeIO      Reason = "handshake_io"       // peer closed or I/O error during pre-handshake
	ReasonFlood            Reason = "flood"              // MaxPending reached
	ReasonFloodPerIP       Reason = "flood_per_ip"       // MaxPendingPerIP reached
	ReasonConnLimit        Reason = "conn_limit"         // MaxConns reached
)

// Stats is a snapshot of a Guard's counters. Counts are since the Guard was
// created; Pending and Open are current values.
type Stats struct {
	Accepted uint64 // TCP connections accepted by the guard's listeners
	Admitted uint64 // connections handed to zmq4 after a valid pre-handshake
	Dialed   uint64 // connections dialed through the guard
	Pending  int64  // connections currently in pre-handshake
	Open     int64  // accepted connections handed to zmq4 and not yet closed

	// Pre-handshake rejections, by reason.
	BadSignature       uint64
	BadVersion         uint64
	BadMechanism       uint64
	BadServerFlag      uint64
	BadReady           uint64
	PeerTypeRejected   uint64
	DuplicateRejected  uint64
	HandshakeTimeouts  uint64
	HandshakeIOErrors  uint64
	FloodRejected      uint64 // refused: MaxPending connections already in pre-handshake
	FloodRejectedPerIP uint64 // refused: MaxPendingPerIP from the same source
	ConnLimitRejected  uint64 // refused: MaxConns established connections

	// Established connections cut by the guard.
	OversizedFrames   uint64 // a message frame declared more than MaxFrameSize
	OversizedMessages uint64 // a message exceeded MaxMessageSize or MaxFramesPerMessage
	OversizedCommands uint64 // a command declared more than MaxCommandSize
	ProtocolErrors    uint64 // malformed framing (e.g. multipart command)
	WriteTimeouts     uint64 // an outgoing message missed WriteTimeout (peer not reading)
	HandedOver        uint64 // older connection closed by DuplicateHandover
	Disconnected      uint64 // closed by Guard.Disconnect

	CommandsDropped uint64 // post-handshake ZMTP commands (PING, ...) swallowed, not given to zmq4
	PingsAnswered   uint64 // ZMTP 3.1 PINGs answered with a PONG by the guard
}

// Rejected returns the pre-handshake rejection counts keyed by Reason.
func (s Stats) Rejected() map[Reason]uint64 {
	return map[Reason]uint64{
		ReasonBadSignature:     s.BadSignature,
		ReasonBadVersion:       s.BadVersion,
		ReasonBadMechanism:     s.BadMechanism,
		ReasonBadServerFlag:    s.BadServerFlag,
		ReasonBadReady:         s.BadReady,
		ReasonPeerType:         s.PeerTypeRejected,
		ReasonDuplicate:        s.DuplicateRejected,
		ReasonHandshakeTimeout: s.HandshakeTimeouts,
		ReasonHandshakeIO:      s.HandshakeIOErrors,
		ReasonFlood:            s.FloodRejected,
		ReasonFloodPerIP:       s.FloodRejectedPerIP,
		ReasonConnLimit:        s.ConnLimitRejected,
	}
}

type counters struct {
	accepted, admitted, dialed                  atomic.Uint64
	pending, open                               atomic.Int64
	badSignature, badVersion, badMechanism      atomic.Uint64
	badServerFlag, badReady, peerType           atomic.Uint64
	duplicate, hsTimeout, hsIO                  atomic.Uint64
	flood, floodPerIP, connLimit                atomic.Uint64
	oversizedFrames, oversizedMsgs, oversizeCmd atomic.Uint64
	protocol, writeTimeouts, handedOver         atomic.Uint64
	disconnected, cmdsDropped, pings            atomic.Uint64
}

func (c *counters) reject(r Reason) {
	switch r {
	case ReasonBadSignature:
		c.badSignature.Add(1)
	case ReasonBadVersion:
		c.badVersion.Add(1)
	case ReasonBadMechanism:
		c.badMechanism.Add(1)
	case ReasonBadServerFlag:
		c.badServerFlag.Add(1)
	case ReasonBadReady:
		c.badReady.Add(1)
	case ReasonPeerType:
		c.peerType.Add(1)
	case ReasonDuplicate:
		c.duplicate.Add(1)
	case ReasonHandshakeTimeout:
		c.hsTimeout.Add(1)
	case ReasonHandshakeIO:
		c.hsIO.Add(1)
	case ReasonFlood:
		c.flood.Add(1)
	case ReasonFloodPerIP:
		c.floodPerIP.Add(1)
	case ReasonConnLimit:
		c.connLimit.Add(1)
	}
}

// cut counts a connection cut for the given sentinel reason.
func (c *counters) cut(reason error) {
	switch reason {
	case ErrFrameTooLarge:
		c.oversizedFrames.Add(1)
	case ErrMessageTooLarge:
		c.oversizedMsgs.Add(1)
	case ErrCommandTooLarge:
		c.oversizeCmd.Add(1)
	case ErrProtocol:
		c.protocol.Add(1)
	case ErrWriteStalled:
		c.writeTimeouts.Add(1)
	case ErrDisconnected:
		c.disconnected.Add(1)
	case ErrHandedOver:
		c.handedOver.Add(1)
	}
}

func (c *counters) snapshot() Stats {
	return Stats{
		Accepted:           c.accepted.Load(),
		Admitted:           c.admitted.Load(),
		Dialed:             c.dialed.Load(),
		Pending:            c.pending.Load(),
		Open:               c.open.Load(),
		BadSignature:       c.badSignature.Load(),
		BadVersion:         c.badVersion.Load(),
		BadMechanism:       c.badMechanism.Load(),
		BadServerFlag:      c.badServerFlag.Load(),
		BadReady:           c.badReady.Load(),
		PeerTypeRejected:   c.peerType.Load(),
		DuplicateRejected:  c.duplicate.Load(),
		HandshakeTimeouts:  c.hsTimeout.Load(),
		HandshakeIOErrors:  c.hsIO.Load(),
		FloodRejected:      c.flood.Load(),
		FloodRejectedPerIP: c.floodPerIP.Load(),
		ConnLimitRejected:  c.connLimit.Load(),
		OversizedFrames:    c.oversizedFrames.Load(),
		OversizedMessages:  c.oversizedMsgs.Load(),
		OversizedCommands:  c.oversizeCmd.Load(),
		ProtocolErrors:     c.protocol.Load(),
		WriteTimeouts:      c.writeTimeouts.Load(),
		HandedOver:         c.handedOver.Load(),
		Disconnected:       c.disconnected.Load(),
		CommandsDropped:    c.cmdsDropped.Load(),
		PingsAnswered:      c.pings.Load(),
	}
}
