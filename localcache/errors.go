package localcache

import "errors"

var (
	// ErrTooLarge is returned when a value is larger than the cache's byte
	// budget: it could never be held.
	ErrTooLarge = errors.New("localcache: value larger than the cache budget")
	// ErrInvalidValue is returned for a value that cannot be held: a nil
	// one, one whose Size is negative, or one whose Size panics.
	ErrInvalidValue = errors.New("localcache: invalid value")
	// ErrComputeTimeout is returned to every waiter when a compute runs past
	// the compute timeout.
	ErrComputeTimeout = errors.New("localcache: compute timed out")
	// ErrComputePanicked wraps the value of a panic in a compute function.
	ErrComputePanicked = errors.New("localcache: compute panicked")
	// ErrInvalidOption is returned by New for an option out of range.
	ErrInvalidOption = errors.New("localcache: invalid option")
	// ErrNoRequest is returned when a call that pins gets an empty request id.
	ErrNoRequest = errors.New("localcache: empty request id")
	// ErrClosed is returned by calls on a closed cache.
	ErrClosed = errors.New("localcache: cache closed")
	// ErrInFlight is returned by GetOrStart when a compute of the key is
	// already running.
	ErrInFlight = errors.New("localcache: a compute of the key is running")
)
