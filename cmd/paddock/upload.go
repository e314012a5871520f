package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/config"
)

// defaultMaxModuleBytes returns the CLI's default --max-module-bytes: the
// host's default api.max_module_bytes. The API does not tell its limit,
// so the CLI refuses bigger files before reading them; a host configured
// lower answers 413 body_too_large, which is the final word.
func defaultMaxModuleBytes() int64 { return config.Default().API.MaxModuleBytes }

// NotRegularFileError is the error for a file the CLI would read (a
// module to upload, a plugin binary to checksum) that is not a regular
// file: a device such as /dev/zero or a FIFO would be read without end
// or block.
type NotRegularFileError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularFileError) Error() string {
	return fmt.Sprintf("%s is not a regular file (mode %s): refusing to read it", e.Path, e.Mode)
}

// FileTooLargeError is the error for a module file over the CLI's upload
// limit, found before reading it.
type FileTooLargeError struct {
	Path        string
	Size, Limit int64
}

func (e *FileTooLargeError) Error() string {
	return fmt.Sprintf("%s is %d bytes, over the upload limit of %d bytes (--max-module-bytes; the host's default api.max_module_bytes)",
		e.Path, e.Size, e.Limit)
}

// openRegular opens path for reading if it is a regular file, and returns
// it with its size. It checks before opening (opening a FIFO blocks until
// a writer comes) and again on the open file (path may have changed in
// between).
func openRegular(path string) (*os.File, int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, &NotRegularFileError{Path: path, Mode: fi.Mode()}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, &NotRegularFileError{Path: path, Mode: fi.Mode()}
	}
	return f, fi.Size(), nil
}

// upload uploads the wasm module in file and returns it as stored. The
// file must be a regular file of at most --max-module-bytes; it is
// streamed, not read into memory.
func (c *client) upload(ctx context.Context, file string, opts ...apiclient.CallOption) (apiclient.Module, error) {
	if c.maxModule < 0 {
		return apiclient.Module{}, fmt.Errorf("--max-module-bytes %d: want 0 (no limit here) or a positive size", c.maxModule)
	}
	f, size, err := openRegular(file)
	if err != nil {
		return apiclient.Module{}, err
	}
	defer f.Close()
	if c.maxModule > 0 && size > c.maxModule {
		return apiclient.Module{}, &FileTooLargeError{Path: file, Size: size, Limit: c.maxModule}
	}
	m, err := c.api().UploadModuleFrom(ctx, f, size, opts...)
	return m, c.reach(err)
}

// fileSHA256 returns the hex sha256 of the regular file at path, read as
// a stream.
func fileSHA256(path string) (string, error) {
	f, _, err := openRegular(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
