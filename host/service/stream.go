package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/store"
)

// ErrStreamsDisabled: the service was built without a stream hub
// (WithStream), so it cannot serve session streams.
var ErrStreamsDisabled = errors.New("this service has no stream hub")

// WithStream makes s serve session streams from hub and poke it after
// its own stream writes (ResolveWait). It returns s.
func (s *Service) WithStream(hub *stream.Hub) *Service {
	s.hub = hub
	return s
}

// poke wakes the stream readers of key on this host after a write that
// added frames.
func (s *Service) poke(key store.ActorKey) {
	if s.hub != nil {
		s.hub.Poke(key)
	}
}

// StreamHead is the stream position "head": after the session's last
// frame, whatever its number.
const StreamHead = "head"

// StreamPosition is where a subscription starts: after After, or, with
// Head, after the session's last frame.
type StreamPosition struct {
	After stream.Cursor
	Head  bool
}

// ParseStreamPosition parses a stream position given as field: an SSE
// event id ("", "<seq>" or "<seq>.<chunk>") or StreamHead; else an
// *InvalidError for field.
func ParseStreamPosition(field, id string) (StreamPosition, error) {
	if id == StreamHead {
		return StreamPosition{Head: true}, nil
	}
	c, err := stream.ParseCursor(id)
	if err != nil {
		return StreamPosition{}, invalid(field, "%s: %v, or \"head\"", field, err)
	}
	return StreamPosition{After: c}, nil
}

// Stream subscribes to session x's stream (as GetSession returned it)
// after position p (the zero position: from the oldest kept frame; see
// stream.Hub.Subscribe; Head: after the last frame). The caller drives the subscription with Next and
// must Close it. Refusals: store.ErrSessionDestroyed (wrapped) for a
// destroyed session (its stream gets no more frames; its transcript
// stays), a *NotFoundError when the session is gone, ErrStreamsDisabled.
func (s *Service) Stream(ctx context.Context, x store.Session, p StreamPosition) (*stream.Subscription, error) {
	if s.hub == nil {
		return nil, ErrStreamsDisabled
	}
	if x.Status == store.SessionDestroyed {
		return nil, fmt.Errorf("stream of session %s: %w", x.SessionID, store.ErrSessionDestroyed)
	}
	var sub *stream.Subscription
	var err error
	if p.Head {
		sub, err = s.hub.SubscribeAtHead(ctx, x.ActorKey)
	} else {
		sub, err = s.hub.Subscribe(ctx, x.ActorKey, p.After)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &NotFoundError{Resource: ResourceSession, Field: "session", Message: fmt.Sprintf("session %q not found", x.SessionID)}
	}
	return sub, wrap("stream", err)
}
