package coordinator

import (
	"errors"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
)

var (
	// ErrHeld is returned by Reserve when another process holds the key's
	// lease or has committed it. It is lease.ErrHeld.
	ErrHeld = lease.ErrHeld
	// ErrLeaseLost is returned by a Reservation's Commit when the lease's
	// revision is no longer the key's: it expired, or another process took
	// the key over. The fencing refused the write. It is lease.ErrLost.
	ErrLeaseLost = lease.ErrLost
	// ErrStoreUnavailable is returned when NATS or the bucket cannot be
	// reached: by New in ModeStrict, and by calls in ModeStrict.
	ErrStoreUnavailable = errors.New("coordinator: store unavailable")
	// ErrBadRecord is returned for a lease record that does not decode or
	// breaks the protocol's rules. It is lease.ErrBadRecord.
	ErrBadRecord = lease.ErrBadRecord
	// ErrNoTransport is returned when no configured transport can fetch a
	// Location. It is payload.ErrNoTransport.
	ErrNoTransport = payload.ErrNoTransport
	// ErrInvalidOption is returned by New for an option out of range, or a
	// WithLeaseShards other than the bucket's.
	ErrInvalidOption = errors.New("coordinator: invalid option")
	// ErrTenant is returned for a key of a tenant the Cache does not serve
	// (see WithTenants).
	ErrTenant = errors.New("coordinator: tenant not served by this cache")
	// ErrClosed is returned (wrapped) by calls made after Close has
	// begun, and by calls in flight that Close cancelled: GetOrCompute,
	// Get, Reserve, a Reservation's Commit and Abandon, Ping (an
	// Invalidate in flight is finished). A Reservation that Close stopped
	// ends with it (Reservation.Err).
	ErrClosed = errors.New("coordinator: cache closed")
	// ErrComputeTimeout is returned to a caller whose compute, or whose
	// wait for another process's compute, outlasted the compute timeout
	// (WithComputeTimeout). It is localcache.ErrComputeTimeout.
	ErrComputeTimeout = localcache.ErrComputeTimeout
	// ErrNotCached is returned by Get for a key with no committed value
	// (not cached, or still computing).
	ErrNotCached = errors.New("coordinator: not cached")
)
