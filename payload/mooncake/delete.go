//go:build mooncake && cgo

package mooncake

import (
	"context"
	"errors"
	"time"

	"github.com/embcache/embcache/payload"
)

// Generation returns the zero Generation: Mooncake keeps no generations
// of an object, nor removes one conditionally.
func (s *Store) Generation(context.Context, payload.Location) (payload.Generation, error) {
	return payload.Generation{}, nil
}

// verifiedFor is how long Delete trusts its own check of an object's
// bytes: the object is read (leased) once, and removed by a later Delete
// once that lease has lapsed, without reading it again.
const verifiedFor = 2 * time.Minute

// Delete removes the object if it holds loc's bytes, and if no reader
// holds it: Mooncake leases an object to each reader, for about 10 s
// after a get (the master's --default_kv_lease_ttl), and the remove is not
// forced, so none is removed under a reader. Delete checks the bytes with
// a get of its own, which leases the object too: the first Delete of an
// object returns ErrBusy, and one after the lease has lapsed (within
// verifiedFor of the check, without reading it again) removes it, or
// returns ErrBusy again while readers keep reading it. Callers try again
// later (the reconciler a few times, then its sweep). An absent object,
// or one with other bytes, is not an error. seen is ignored: the same
// bytes put again between the caller's look at the key's record and this
// delete, or within verifiedFor of the check another value put in its
// place, are not told apart from the object checked, and are removed
// (docs/protocol.md 2.4).
func (s *Store) Delete(ctx context.Context, loc payload.Location, _ payload.Generation) error {
	if !s.checked(loc) {
		v, err := s.Get(ctx, loc)
		switch {
		case errors.Is(err, payload.ErrNotFound), errors.Is(err, payload.ErrCorrupt):
			return nil // gone, or other bytes now
		case err != nil:
			return err
		}
		v.Close()
		s.mu.Lock()
		s.verified[loc.Object] = verifiedObject{sum: loc.Checksum, at: time.Now()}
		s.mu.Unlock()
	}
	err := s.remove(loc, false)
	if !errors.Is(err, ErrBusy) {
		s.mu.Lock()
		delete(s.verified, loc.Object)
		s.mu.Unlock()
	}
	return err
}

// verifiedObject is Delete's check of an object's bytes.
type verifiedObject struct {
	sum payload.Checksum
	at  time.Time
}

// checked reports whether Delete checked loc's bytes within verifiedFor;
// it forgets older checks.
func (s *Store) checked(loc payload.Location) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for name, v := range s.verified {
		if now.Sub(v.at) > verifiedFor {
			delete(s.verified, name)
		}
	}
	v, ok := s.verified[loc.Object]
	return ok && v.sum == loc.Checksum
}

// remove removes loc's object, whatever it holds. Unforced, a remove is
// refused (ErrBusy, -706) while a reader holds the object's lease. Forced
// (Put replacing other bytes: the key's value from before an
// invalidation, which no reader may be served), it goes at once: a reader
// whose object is removed under it gets an error or bytes that fail its
// checksum, never a value.
func (s *Store) remove(loc payload.Location, force bool) error {
	obj, err := loc.ObjectID()
	if err != nil {
		return err
	}
	key := newKey(objectName(obj))
	free := func(int64) { key.free() }
	rc, err := s.call(context.Background(), "remove", 0, func() int64 { return s.lib.remove(key, force) }, free)
	if err != nil {
		return err
	}
	free(rc)
	if rc != 0 && rc != codeObjectNotFound {
		return s.failed("remove", rc)
	}
	return nil
}
