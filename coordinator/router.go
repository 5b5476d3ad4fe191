package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// router picks the transport for each payload operation: this node's put
// transport for writes; for reads, the shm store when the value was
// written on this node, else the transport the Location names.
type router struct {
	node    string
	putter  payload.Transport
	getters map[string]payload.Transport
	shm     *shm.Store
}

func (r *router) put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	return r.putter.Put(ctx, obj, v)
}

func (r *router) get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	if r.shm != nil && loc.Node == r.node && loc.Transport != payload.TransportShm {
		local := loc
		local.Transport, local.Address = payload.TransportShm, r.shm.Dir()
		v, err := r.shm.Get(ctx, local)
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
	return t.Get(ctx, loc)
}
