package localcache

import (
	"encoding/json"
	"fmt"
)

// Stats is a snapshot of a cache's counters and size.
type Stats struct {
	Hits          uint64 // lookups answered by a live entry
	Misses        uint64 // lookups that found none
	Computes      uint64 // computes started
	ComputeErrors uint64 // computes that failed
	Waits         uint64 // misses that joined a running compute
	Mutations     uint64 // values found changed by the mutation guard
	// Evictions counts entries that left, indexed by Cause; in JSON, an
	// object keyed by the causes' names.
	Evictions Evictions

	Entries     int   // live entries, pinned or not
	Bytes       int64 // bytes held, including pinned and invalidated-but-pinned
	Pinned      int   // entries with at least one pin
	PinnedBytes int64
	InFlight    int // computes running
	Requests    int // requests holding pins
}

// Evictions counts entries that left, indexed by Cause.
type Evictions [numCauses]uint64

// MarshalJSON writes the counts keyed by cause name ("size", "ttl", ...).
func (e Evictions) MarshalJSON() ([]byte, error) {
	m := make(map[string]uint64, len(e)-1)
	for c := CauseSize; c < numCauses; c++ {
		m[c.String()] = e[c]
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON writes; an unknown cause is an error.
func (e *Evictions) UnmarshalJSON(b []byte) error {
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*e = Evictions{}
	for name, n := range m {
		c := CauseSize
		for c < numCauses && c.String() != name {
			c++
		}
		if c == numCauses {
			return fmt.Errorf("localcache: unknown eviction cause %q", name)
		}
		e[c] = n
	}
	return nil
}

// Evicted returns how many entries left for the given cause.
func (s Stats) Evicted(c Cause) uint64 {
	if int(c) < len(s.Evictions) {
		return s.Evictions[c]
	}
	return 0
}

// Stats returns a snapshot of the counters.
func (c *Cache[K, V]) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Entries = c.lru.Len()
	s.Bytes = c.bytes
	pinned := map[*entry[V]]bool{}
	for _, set := range c.requests {
		for _, e := range set.entries {
			pinned[e] = true
		}
	}
	s.Pinned = len(pinned)
	for e := range pinned {
		s.PinnedBytes += e.size
	}
	s.InFlight = len(c.flights)
	s.Requests = len(c.requests)
	return s
}
