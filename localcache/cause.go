package localcache

import "fmt"

// Cause says why an entry left the cache.
type Cause uint8

// Eviction causes.
const (
	// CauseSize: evicted to keep the cache within its byte or entry budget.
	CauseSize Cause = iota + 1
	// CauseTTL: its time to live ran out.
	CauseTTL
	// CauseInvalidated: removed by Invalidate (a weight update).
	CauseInvalidated
	// CauseExplicit: removed by Remove.
	CauseExplicit
	// CauseStore: the store's copy is gone (its record expired, or was
	// removed for a reason other than an invalidation).
	CauseStore
	numCauses
)

// named is c if it is one of the named causes, CauseExplicit otherwise.
// The zero Cause is not one: an entry's zero Cause means it is still in
// the index.
func (c Cause) named() Cause {
	if c >= CauseSize && c < numCauses {
		return c
	}
	return CauseExplicit
}

// String returns "size", "ttl", "invalidated", "explicit" or "store".
func (c Cause) String() string {
	switch c {
	case CauseSize:
		return "size"
	case CauseTTL:
		return "ttl"
	case CauseInvalidated:
		return "invalidated"
	case CauseExplicit:
		return "explicit"
	case CauseStore:
		return "store"
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}
