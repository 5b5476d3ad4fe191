package httppull

import (
	"context"
	"io"
	"net/http"

	"github.com/embcache/embcache/payload"
)

// Reader pulls values other nodes serve and writes none: a node that
// writes with another transport (shm, Mooncake) reads HTTP Locations with
// one. Safe for concurrent use.
type Reader struct{ t *Transport }

// NewReader returns a Reader; the options are a Transport's (client,
// token, peers, size limit). A Reader has no address of its own: with a
// token, it pulls only from its peers (WithPeers).
func NewReader(opts ...Option) (*Reader, error) {
	t := &Transport{client: &http.Client{}, maxSize: DefaultMaxSize}
	for _, opt := range opts {
		if err := opt(t); err != nil {
			return nil, err
		}
	}
	return &Reader{t: t}, nil
}

// Get pulls and verifies the value at loc, as Transport.Get does.
func (r *Reader) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	return r.t.Get(ctx, loc)
}

// Stream requests the value at loc, as Transport.Stream does.
func (r *Reader) Stream(ctx context.Context, loc payload.Location) (io.ReadCloser, error) {
	return r.t.Stream(ctx, loc)
}
