package client_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// zeros is an endless reader of zero bytes, like /dev/zero.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestUploadModuleFromStreams uploads modules through the real API from
// readers that are not byte slices: a module streamed from a reader is
// stored as the same module as its bytes, exactly size bytes are read
// from an endless reader, and one over the server's limit (32 MiB here)
// is the server's 413 body_too_large.
func TestUploadModuleFromStreams(t *testing.T) {
	base := newServer(t)
	ctx := context.Background()
	c := client.New(base, client.WithToken(token))
	_, notesWasm := wasmtest.BuildExample(t, wasmtest.Notes)
	m, err := c.UploadModuleFrom(ctx, struct{ io.Reader }{strings.NewReader(string(notesWasm))}, int64(len(notesWasm)))
	if err != nil || m.Created == nil || !*m.Created || m.Size != int64(len(notesWasm)) {
		t.Fatalf("UploadModuleFrom: %+v %v", m, err)
	}
	if again, err := c.UploadModule(ctx, notesWasm); err != nil || again.Created == nil || *again.Created || again.Digest != m.Digest {
		t.Errorf("UploadModule of the same bytes: %+v %v, want the digest %s stored already", again, err, m.Digest)
	}

	// Exactly size bytes of an endless reader: 1 KiB of zeros is no wasm.
	_, err = c.UploadModuleFrom(ctx, zeros{}, 1024)
	wantCode(t, "UploadModuleFrom of 1 KiB of zeros", err, 400, client.CodeInvalidModule)

	_, err = c.UploadModuleFrom(ctx, zeros{}, 33<<20)
	wantCode(t, "UploadModuleFrom over the limit", err, 413, client.CodeBodyTooLarge)

	if _, err := c.UploadModuleFrom(ctx, zeros{}, -1); err == nil {
		t.Error("UploadModuleFrom with a negative size: no error")
	}
}
