package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// router picks the transport for each payload operation: this node's put
// transport for writes; for reads, the shm store when the value was
// written on this node, else the transport the Location names (with
// pullToShm, streaming into the shm store when that transport can).
type router struct {
	node      string
	putter    payload.Transport
	getters   map[string]payload.Transport
	shm       *shm.Store
	pullToShm bool
}

// streamer is a transport that hands a value's bytes over as they arrive,
// unverified, for a store that verifies them as it writes them
// (httppull.Transport).
type streamer interface {
	Stream(ctx context.Context, loc payload.Location) (io.ReadCloser, error)
}

// errNotReceived says that a value could not be received into the shm
// store and must be pulled into memory instead.
var errNotReceived = errors.New("coordinator: not received into shm")

func (r *router) put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	return r.putter.Put(ctx, obj, v)
}

func (r *router) get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	if r.shm != nil && loc.Node == r.node && loc.Transport != payload.TransportShm {
		v, err := r.shm.Get(ctx, r.inShm(loc))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, payload.ErrNotFound) {
			return nil, err
		}
	}
	t := r.getters[loc.Transport]
	if t == nil {
		return nil, fmt.Errorf("%w: %s (node %s)", ErrNoTransport, loc.Transport, loc.Node)
	}
	if s, ok := t.(streamer); ok && r.pullToShm && r.shm != nil && loc.Node != r.node {
		v, err := r.receive(ctx, s, loc)
		if !errors.Is(err, errNotReceived) {
			return v, err
		}
	}
	return t.Get(ctx, loc)
}

// inShm is loc as the shm store of this node names the same object.
func (r *router) inShm(loc payload.Location) payload.Location {
	loc.Transport, loc.Address = payload.TransportShm, r.shm.Dir()
	return loc
}

// receive streams the value at loc into the shm store, which hashes it as
// it writes it and puts it in place only if it is loc's, and returns the
// value read from its file: one pass over the bytes, no copy in memory. A
// file received before is read without a pull. errNotReceived means the
// store cannot take it (no room, another value holds its name), not that
// the value is bad: a pull into memory may still get it.
func (r *router) receive(ctx context.Context, s streamer, loc payload.Location) (*payload.Value, error) {
	local := r.inShm(loc)
	v, err := r.shm.Get(ctx, local)
	switch {
	case err == nil:
		return v, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case !errors.Is(err, payload.ErrNotFound):
		return nil, errNotReceived
	}
	obj, err := loc.ObjectID()
	if err != nil {
		return nil, err
	}
	body, err := s.Stream(ctx, loc)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	got, err := r.shm.Receive(ctx, obj, loc.Size, loc.Checksum, body)
	if err != nil {
		if errors.Is(err, payload.ErrCorrupt) || ctx.Err() != nil {
			return nil, err
		}
		return nil, errNotReceived // the store's trouble (no room): the value may still be pulled
	}
	if got.Size != loc.Size || got.Checksum != loc.Checksum {
		return nil, errNotReceived // another writer's value won the name
	}
	if v, err = r.shm.Get(ctx, local); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errNotReceived // deleted meanwhile
	}
	return v, nil
}
