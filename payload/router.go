package payload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"
)

// NodeStore is a node's own store of payload files (package shm): every
// process of the node reads them in place. A value written on this node
// is read from it whatever transport its Location names; values pulled
// from other nodes may land in it (WithPullToNodeStore).
type NodeStore interface {
	Transport
	// Dir is where the files lie: the Address of their Locations.
	Dir() string
	// Receive writes the value read from r under obj, hashing it as it
	// writes, and puts it in place only if its size and checksum are the
	// ones given.
	Receive(ctx context.Context, obj ObjectID, size int64, sum Checksum, r io.Reader) (Location, error)
	// Files lists the values' files.
	Files() iter.Seq[StoredFile]
	// Sweep removes the temp files of writers that died mid-write, and
	// returns how many.
	Sweep() (int, error)
}

// StoredFile is a value's file in a NodeStore.
type StoredFile struct {
	Location   Location   // its Location, with the checksum its file holds
	ModTime    time.Time  // when it was put in place, or last put again
	Generation Generation // when it was listed (Transport.Generation)
}

// streamer is a transport that hands a value's bytes over as they arrive,
// unverified, for a store that verifies them as it writes them
// (httppull.Transport).
type streamer interface {
	Stream(ctx context.Context, loc Location) (io.ReadCloser, error)
}

// Reader fetches and verifies the value a Location describes (a
// Transport is one); the caller must Close it.
type Reader interface {
	Get(ctx context.Context, loc Location) (*Value, error)
}

// Router is one node's payload plane: writes go to the transport the node
// writes with; a read goes to the node's store when the value was written
// on this node, else to the reader of the transport its Location names.
// Safe for concurrent use.
type Router struct {
	node        string
	writer      Transport
	readers     map[string]Reader // by transport kind
	store       NodeStore         // or nil
	pullToStore bool
}

// RouterOption configures a Router.
type RouterOption func(*Router) error

// NewRouter returns the router of node, writing with w, a transport of
// kind (TransportShm, TransportHTTP, TransportMooncake, TransportMemory),
// which also reads Locations of that kind. Bad arguments or options are
// ErrInvalidOption.
func NewRouter(node, kind string, w Transport, opts ...RouterOption) (*Router, error) {
	if node == "" || kind == "" || w == nil {
		return nil, fmt.Errorf("%w: a router needs a node, a transport kind and a writer", ErrInvalidOption)
	}
	r := &Router{node: node, writer: w, readers: map[string]Reader{kind: w}}
	for _, opt := range opts {
		if err := opt(r); err != nil {
			return nil, err
		}
	}
	if r.pullToStore && r.store == nil {
		return nil, fmt.Errorf("%w: pulls into the node's store need a node store", ErrInvalidOption)
	}
	return r, nil
}

// WithReader reads Locations of transport kind with t.
func WithReader(kind string, t Reader) RouterOption {
	return func(r *Router) error {
		if kind == "" || t == nil {
			return fmt.Errorf("%w: a reader needs a transport kind and a transport", ErrInvalidOption)
		}
		r.readers[kind] = t
		return nil
	}
}

// WithNodeStore gives the node's own store: values written on this node
// are read from it whatever transport their Location names, and shm
// Locations are read with it.
func WithNodeStore(s NodeStore) RouterOption {
	return func(r *Router) error {
		if s == nil {
			return fmt.Errorf("%w: nil node store", ErrInvalidOption)
		}
		r.store = s
		if r.readers[TransportShm] == nil {
			r.readers[TransportShm] = s
		}
		return nil
	}
}

// WithPullToNodeStore makes values pulled from other nodes land in the
// node's store (WithNodeStore): each is streamed into a file, hashed as it
// is written and put in place only if it matches its Location's checksum,
// then read from that file, so the process holds no copy of its own. A
// file received before is read without a pull. Without room in the store
// the value is pulled into memory. For a node agent, which hands its
// processes the store's files anyway.
func WithPullToNodeStore() RouterOption {
	return func(r *Router) error { r.pullToStore = true; return nil }
}

// Node is the node the router is for.
func (r *Router) Node() string { return r.node }

// Writer is the transport values are written with.
func (r *Router) Writer() Transport { return r.writer }

// NodeStore is the node's store, or nil.
func (r *Router) NodeStore() NodeStore { return r.store }

// Put writes v under obj with the writer.
func (r *Router) Put(ctx context.Context, obj ObjectID, v *Value) (Location, error) {
	return r.writer.Put(ctx, obj, v)
}

// Get fetches and verifies the value at loc. A transport it has no reader
// for is ErrNoTransport.
func (r *Router) Get(ctx context.Context, loc Location) (*Value, error) {
	if r.store != nil && loc.Node == r.node && loc.Transport != TransportShm {
		// The node's file of the object is read first: the file the
		// node's pull server serves (http), or a copy (the agent places
		// the values it serves there: Mooncake's, memory's). A missing
		// one, or one of other bytes (another value of the key), says
		// nothing of a copied value, which its own transport is asked
		// for: a reader must not purge an intact record over a stale copy.
		v, err := r.store.Get(ctx, r.inStore(loc))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrCorrupt) {
			return nil, err
		}
	}
	t := r.readers[loc.Transport]
	if t == nil {
		return nil, fmt.Errorf("%w: %s (node %s)", ErrNoTransport, loc.Transport, loc.Node)
	}
	if s, ok := t.(streamer); ok && r.pullToStore && loc.Node != r.node {
		v, err := r.receive(ctx, s, loc)
		if !errors.Is(err, errNotReceived) {
			return v, err
		}
	}
	return t.Get(ctx, loc)
}

// inStore is loc as the node's store names the same object.
func (r *Router) inStore(loc Location) Location {
	loc.Transport, loc.Address = TransportShm, r.store.Dir()
	return loc
}

// errNotReceived says that a value could not be received into the node's
// store and must be pulled into memory instead.
var errNotReceived = errors.New("payload: not received into the node's store")

// receive streams the value at loc into the node's store, which hashes it
// as it writes it and puts it in place only if it is loc's, and returns
// the value read from its file: one pass over the bytes, no copy in
// memory. A file received before is read without a pull. errNotReceived
// means the store cannot take it (no room, another value holds its name),
// not that the value is bad: a pull into memory may still get it.
func (r *Router) receive(ctx context.Context, s streamer, loc Location) (*Value, error) {
	local := r.inStore(loc)
	v, err := r.store.Get(ctx, local)
	switch {
	case err == nil:
		return v, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case !errors.Is(err, ErrNotFound):
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
	got, err := r.store.Receive(ctx, obj, loc.Size, loc.Checksum, body)
	if err != nil {
		if errors.Is(err, ErrCorrupt) || ctx.Err() != nil {
			return nil, err
		}
		return nil, errNotReceived // the store's trouble (no room): the value may still be pulled
	}
	if got.Size != loc.Size || got.Checksum != loc.Checksum {
		return nil, errNotReceived // another writer's value won the name
	}
	if v, err = r.store.Get(ctx, local); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errNotReceived // deleted meanwhile
	}
	return v, nil
}
