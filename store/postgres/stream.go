package postgres

import (
	"context"
	"errors"

	"github.com/paddock-dev/paddock/store"
)

// TODO(stream): placeholders until the driver's stream and wait writes land.

var errStreamTODO = errors.ErrUnsupported

func (s *Store) AppendChunks(ctx context.Context, p store.AppendChunksParams) (store.Frame, error) {
	return store.Frame{}, errStreamTODO
}

func (s *Store) StreamFrames(ctx context.Context, p store.StreamFramesParams) (store.StreamPage, error) {
	return store.StreamPage{}, errStreamTODO
}

func (s *Store) StreamHeads(ctx context.Context, keys []store.ActorKey) (map[store.ActorKey]int64, error) {
	return nil, errStreamTODO
}

func (s *Store) CompactStream(ctx context.Context, p store.CompactStreamParams) (int, error) {
	return 0, errStreamTODO
}

func (s *Store) ResolveWait(ctx context.Context, p store.ResolveWaitParams) (store.Wait, error) {
	return store.Wait{}, errStreamTODO
}

func (s *Store) GetWait(ctx context.Context, key store.ActorKey, waitID string) (store.Wait, error) {
	return store.Wait{}, errStreamTODO
}

func (s *Store) ListWaits(ctx context.Context, p store.ListWaitsParams) (store.WaitPage, error) {
	return store.WaitPage{}, errStreamTODO
}

func (s *Store) ExpireDueWaits(ctx context.Context, limit int) ([]store.ActorKey, error) {
	return nil, errStreamTODO
}
