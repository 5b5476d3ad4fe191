package lease

import (
	"context"
	"time"
)

// Store is what a lease writes and reads its key through: a *Bucket, or
// a wrapper of one (tests make answers slow or lose them with one).
type Store interface {
	Create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error)
	CompareAndSet(ctx context.Context, key string, rev uint64, r Record, ttl time.Duration) (uint64, error)
	Purge(ctx context.Context, key string, rev uint64) error
	Read(ctx context.Context, key string) (Entry, error)
	// Direct reports whether a Read may be a follower's answer, which
	// never proves that a write landed.
	Direct() bool
}
