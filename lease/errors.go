package lease

import (
	"errors"
	"fmt"
)

var (
	// ErrHeld is returned by Bucket.Create and Acquire when the key is
	// live: another process holds its lease or has committed it.
	ErrHeld = errors.New("lease: key held by another process")
	// ErrLost is returned by a Lease's writes, and by Bucket.CompareAndSet
	// and the purges, when the revision is no longer the key's: it expired,
	// or another process took the key over. The fencing refused the write.
	ErrLost = errors.New("lease: lost")
	// ErrBadRecord is returned for a record that does not decode or breaks
	// the protocol's rules, read or about to be written.
	ErrBadRecord = errors.New("lease: bad record")
	// ErrInvalidConfig is returned by Acquire for a Config it cannot hold
	// a lease with.
	ErrInvalidConfig = errors.New("lease: invalid config")
	// ErrShards is returned by OpenBucket and BindBucket for a number of
	// shards out of range, or other than the one the bucket was created
	// with.
	ErrShards = errors.New("lease: shards")
	// ErrNoRepublish is returned by Bucket.EnsureRepublish for a shard
	// whose stream does not republish what it stores as Changes needs:
	// its waiters only poll.
	ErrNoRepublish = errors.New("lease: the bucket does not republish what it stores")
	// ErrClosed is returned by Bucket.Tombstone and Invalidated, after
	// Bucket.Close, to a caller that shared a read the close cancelled or
	// kept from being sent: the tombstone could not be read.
	ErrClosed = errors.New("lease: bucket closed")
	// ErrTombstoneBehind is returned by Bucket.Invalidated for a tombstone
	// read that does not reflect an invalidation the caller has heard of:
	// the server that answered has not got it yet.
	ErrTombstoneBehind = errors.New("lease: tombstone read behind an invalidation heard of")
)

// ErrLate is returned by Acquire for a create acknowledged after its own
// TTL: the server's TTL marker may wipe it, so it is given back. It wraps
// ErrLost.
var ErrLate = fmt.Errorf("%w: acknowledged too late", ErrLost)
