package coordinator

import (
	"errors"
	"fmt"
)

var (
	// ErrHeld is returned by Reserve when another process holds the key's
	// lease or has committed it.
	ErrHeld = errors.New("coordinator: key held by another process")
	// ErrLeaseLost is returned by Commit and heartbeats when the lease's
	// revision is no longer the key's: it expired, or another process took
	// the key over. The fencing refused the write.
	ErrLeaseLost = errors.New("coordinator: lease lost")
	// ErrStoreUnavailable is returned when NATS or the bucket cannot be
	// reached: by New in ModeStrict, and by calls in ModeStrict.
	ErrStoreUnavailable = errors.New("coordinator: store unavailable")
	// ErrBadRecord is returned for a lease record that does not decode or
	// breaks the protocol's rules.
	ErrBadRecord = errors.New("coordinator: bad lease record")
	// ErrNoTransport is returned when no configured transport can fetch a
	// Location.
	ErrNoTransport = errors.New("coordinator: no transport for location")
	// ErrInvalidOption is returned by New for an option out of range.
	ErrInvalidOption = errors.New("coordinator: invalid option")
	// ErrTenant is returned for a key of a tenant the Cache does not serve
	// (see WithTenants).
	ErrTenant = errors.New("coordinator: tenant not served by this cache")
	// ErrClosed is returned by calls on a closed Cache.
	ErrClosed = errors.New("coordinator: cache closed")
	// ErrNotCached is returned by Get for a key with no committed value
	// (not cached, or still computing).
	ErrNotCached = errors.New("coordinator: not cached")
)

// errLateReserve is a reservation acknowledged after its own TTL: it may
// be wiped by the server's TTL marker, so it is given back (and is
// ErrLeaseLost to Reserve's callers).
var errLateReserve = fmt.Errorf("%w: reservation acknowledged too late", ErrLeaseLost)
