//go:build mooncake && cgo

package mooncake

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

// objectName is obj's name in the store.
func objectName(obj payload.ObjectID) string { return "embcache/" + obj.String() }

// Put stores v's encoding under obj. An object present with the same bytes
// is left as it is; one with other bytes (the key's value from before an
// invalidation) is removed first, since Mooncake keeps the first put of a
// name. Either way the Location is returned only after is_exist
// reports the object.
func (s *Store) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	if err := obj.Validate(); err != nil {
		return payload.Location{}, err
	}
	if v.Size() > s.cfg.MaxSize {
		return payload.Location{}, fmt.Errorf("%w: %d bytes, limit %d", payload.ErrTooLarge, v.Size(), s.cfg.MaxSize)
	}
	enc, err := payload.Encode(v)
	if err != nil {
		return payload.Location{}, err
	}
	if err := ctx.Err(); err != nil {
		return payload.Location{}, err
	}
	sum := payload.Checksum(blake3.Sum256(enc))
	loc := payload.Location{Transport: payload.TransportMooncake, Node: s.cfg.Node, Address: s.cfg.MasterServerAddr,
		Object: obj.String(), Size: int64(len(enc)), Checksum: sum}
	if same, err := s.holds(ctx, loc); err != nil || same {
		return loc, err
	}
	key := newKey(objectName(obj))
	// The key is freed by the last call that uses it, which may outlive
	// Put (one left to finish on its own).
	// enc holds no Go pointers, put copies it before returning, and the
	// call's closure keeps it alive until then.
	rc, err := s.call(ctx, "put", int64(len(enc)), func() int64 { return s.lib.put(key, enc, s.cfg.Replicas) },
		func(int64) { key.free() })
	if err != nil {
		return payload.Location{}, err
	}
	if rc != 0 && rc != codeObjectAlreadyExists {
		key.free()
		return payload.Location{}, s.failed("put", rc)
	}
	exist, err := s.call(ctx, "is_exist", 0, func() int64 { return s.lib.isExist(key) }, func(int64) { key.free() })
	if err != nil {
		return payload.Location{}, err
	}
	key.free()
	if exist != 1 {
		if exist < 0 {
			return payload.Location{}, s.failed("is_exist", exist)
		}
		return payload.Location{}, fmt.Errorf("%w: put of %v returned %d but the object does not exist", payload.ErrUnavailable, obj, rc)
	}
	return loc, nil
}

// exists reports whether the store has loc's object (is_exist: no read,
// no lease).
func (s *Store) exists(loc payload.Location) (bool, error) {
	obj, err := loc.ObjectID()
	if err != nil {
		return false, err
	}
	key := newKey(objectName(obj))
	free := func(int64) { key.free() }
	rc, err := s.call(context.Background(), "is_exist", 0, func() int64 { return s.lib.isExist(key) }, free)
	if err != nil {
		return false, err
	}
	free(rc)
	if rc < 0 {
		return false, s.failed("is_exist", rc)
	}
	return rc == 1, nil
}

// holds reports whether the store has loc's object with loc's bytes. An
// object with other bytes is removed (false, nil); one that cannot be
// removed is the error.
func (s *Store) holds(ctx context.Context, loc payload.Location) (bool, error) {
	v, err := s.Get(ctx, loc)
	switch {
	case err == nil:
		v.Close()
		return true, nil
	case errors.Is(err, payload.ErrNotFound):
		return false, nil
	case errors.Is(err, payload.ErrCorrupt):
		return false, s.remove(loc, true) // another value's bytes: forced (see remove)
	}
	return false, err // unavailable, busy: not a reason to remove anything
}

// Get reads the object at loc into a registered buffer and verifies it;
// Close on the value returns the buffer. Errors: payload.ErrNotFound,
// payload.ErrCorrupt (size or checksum), payload.ErrTooLarge,
// payload.ErrUnavailable, or a *CodeError.
func (s *Store) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	if err := loc.Validate(); err != nil {
		return nil, err
	}
	if loc.Transport != payload.TransportMooncake {
		return nil, fmt.Errorf("%w: transport %q is not mooncake", payload.ErrInvalidLocation, loc.Transport)
	}
	if loc.Size > s.cfg.MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", payload.ErrTooLarge, loc.Size, s.cfg.MaxSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	obj, _ := loc.ObjectID()
	if err := s.use(); err != nil { // Close waits: buffer registers with the store
		return nil, err
	}
	defer s.done()
	buf, class, err := s.buffer(ctx, int(loc.Size))
	if err != nil {
		return nil, err
	}
	release := func() error { s.putBuffer(buf, class); return nil }
	key := newKey(objectName(obj))
	// A get left to finish on its own writes into buf until it returns:
	// buf goes back to the pool then, not before.
	n, err := s.call(ctx, "get_into", loc.Size, func() int64 { return s.lib.getInto(key, buf, loc.Size) },
		func(int64) { key.free(); release() })
	if err != nil {
		return nil, err
	}
	key.free()
	if n < 0 {
		release()
		return nil, s.failed("get_into", n)
	}
	if int64(n) != loc.Size {
		release()
		return nil, fmt.Errorf("%w: read %d bytes, location says %d", payload.ErrCorrupt, n, loc.Size)
	}
	data := unsafe.Slice((*byte)(buf), int(loc.Size))
	v, err := payload.Verify(data, loc.Size, loc.Checksum)
	if err != nil {
		release()
		return nil, err
	}
	return payload.WithRelease(v, release), nil
}
