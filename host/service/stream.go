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

// ParseStreamPosition parses a stream position (an SSE event id: "",
// "<seq>" or "<seq>.<chunk>") given as field; else an *InvalidError for
// field.
func ParseStreamPosition(field, id string) (stream.Cursor, error) {
	c, err := stream.ParseCursor(id)
	if err != nil {
		return c, invalid(field, "%s: %v", field, err)
	}
	return c, nil
}

// Stream subscribes to session x's stream (as GetSession returned it)
// after position after (the zero Cursor: from the oldest kept frame; see
// stream.Hub.Subscribe). The caller drives the subscription with Next and
// must Close it. Refusals: store.ErrSessionDestroyed (wrapped) for a
// destroyed session (its stream gets no more frames; its transcript
// stays), a *NotFoundError when the session is gone, ErrStreamsDisabled.
func (s *Service) Stream(ctx context.Context, x store.Session, after stream.Cursor) (*stream.Subscription, error) {
	if s.hub == nil {
		return nil, ErrStreamsDisabled
	}
	if x.Status == store.SessionDestroyed {
		return nil, fmt.Errorf("stream of session %s: %w", x.SessionID, store.ErrSessionDestroyed)
	}
	sub, err := s.hub.Subscribe(ctx, x.ActorKey, after)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &NotFoundError{Resource: ResourceSession, Field: "session", Message: fmt.Sprintf("session %q not found", x.SessionID)}
	}
	return sub, wrap("stream", err)
}
