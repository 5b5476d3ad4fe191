package coordinator

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// A commit that does not land (refused by the fencing, failed, cut short
// by Close) leaves the payload its Put wrote under the key's name, named
// by no record of this process. On shm the node's sweep would find the
// file a sweep interval later; a Mooncake Store lists nothing, and would
// keep the object until it evicted it. So the Cache removes what it put
// itself, once the key's record is read not to name it (docs/protocol.md
// 2.5).

// uncommittedPatience is how long an uncommitted payload is kept trying:
// past it the payload is left (to the node's sweep, or the store's
// eviction), counted and logged. It covers another process's compute of
// the key (which may name the bytes) and Mooncake's read lease, which
// refuses an unforced remove for about 10 s after the delete's own check.
const uncommittedPatience = 5 * time.Minute

// uncommittedDirectWait is how long a payload waits before its first try
// when the bucket's reads are direct gets (tenant mode): a follower cut
// off from the others answers them with what it last had for about 5 s
// (docs/jetstream-notes.md (d)), and could show no record where the
// leader holds one that names the payload.
const uncommittedDirectWait = 10 * time.Second

// maxUncommitted bounds the payloads waiting: past it a payload is left
// at once, counted.
const maxUncommitted = 4096

// uncommitted is a payload this process put whose commit did not land.
type uncommitted struct {
	ref   Ref
	loc   payload.Location
	since time.Time // when the commit failed
}

// uncommittedSet holds the payloads waiting for removal, by object.
type uncommittedSet struct {
	mu      sync.Mutex
	pending map[string]uncommitted
	wake    chan struct{} // a payload was added
}

func newUncommittedSet() *uncommittedSet {
	return &uncommittedSet{pending: map[string]uncommitted{}, wake: make(chan struct{}, 1)}
}

// add queues u; it reports false if the set is full.
func (s *uncommittedSet) add(u uncommitted) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[u.loc.Object]; !ok && len(s.pending) >= maxUncommitted {
		return false
	}
	s.pending[u.loc.Object] = u
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// snapshot returns the payloads waiting.
func (s *uncommittedSet) snapshot() []uncommitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.pending))
}

// done forgets u, unless the object was queued again since; it reports
// whether it forgot u.
func (s *uncommittedSet) done(u uncommitted) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.pending[u.loc.Object]; ok && cur == u {
		delete(s.pending, u.loc.Object)
		return true
	}
	return false
}

// drain forgets every payload waiting and returns them.
func (s *uncommittedSet) drain() []uncommitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.pending))
	clear(s.pending)
	return out
}

// len returns how many payloads wait.
func (s *uncommittedSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// putUncommitted queues the payload r put at loc, whose commit did not
// land, for removal.
func (r *Reservation) putUncommitted(loc payload.Location) {
	u := uncommitted{ref: r.ref, loc: loc, since: time.Now()}
	if !r.c.uncommitted.add(u) {
		r.c.obs.uncommittedLeft(u, "too many waiting")
	}
}

// uncommittedLoop tries each waiting payload when one is added, and every
// retry interval while some wait.
func (c *Cache) uncommittedLoop() {
	for {
		var retry <-chan time.Time
		if c.uncommitted.len() > 0 {
			retry = time.After(c.s.retryInterval)
		}
		select {
		case <-c.life.Done():
			return
		case <-c.uncommitted.wake:
		case <-retry:
		}
		for _, u := range c.uncommitted.snapshot() {
			if c.life.Err() != nil {
				return
			}
			if c.removeUncommitted(c.life, u) {
				c.uncommitted.done(u)
			} else if time.Since(u.since) > uncommittedPatience && c.uncommitted.done(u) {
				c.obs.uncommittedLeft(u, "its key still computing, or the store would not remove it")
			}
		}
	}
}

// leaveUncommitted counts and logs the payloads still waiting when Close
// has stopped the loop. Close stops renewing the leases, and a commit it
// cut short leaves its own computing record live for a lease TTL: a
// removal tried now would wait.
func (c *Cache) leaveUncommitted() {
	for _, u := range c.uncommitted.drain() {
		c.obs.uncommittedLeft(u, "the Cache closed")
	}
}

// removeUncommitted deletes u's payload once the key has no live record:
// it reports whether u is settled (deleted, or the record's). The
// payload's generation is read before the record, as every delete does
// (docs/protocol.md 2.4): a compute of the key that puts the same bytes
// after the read makes a generation the delete leaves.
func (c *Cache) removeUncommitted(ctx context.Context, u uncommitted) bool {
	b := c.bucket()
	if b == nil || b.Direct() && time.Since(u.since) < uncommittedDirectWait {
		return false
	}
	w := c.router.Writer()
	octx, cancel := c.opContext(ctx)
	seen, err := w.Generation(octx, u.loc)
	cancel()
	if err != nil {
		return false
	}
	octx, cancel = c.opContext(ctx)
	cur, err := b.Read(octx, u.ref.KVKey())
	cancel()
	if err != nil {
		return false
	}
	if cur.Live {
		// A committed record names the bytes (the commit landed after
		// all, or another process committed the same ones), or names
		// others, which a store without generations (Mooncake: one object
		// per key) has put in their place already, and which the node's
		// sweep tells apart on shm. A computing record, this process's own
		// included, may still commit them: its write may be in flight.
		return cur.Record.State == lease.StateCommitted
	}
	octx, cancel = c.opContext(ctx)
	err = w.Delete(octx, u.loc, seen)
	cancel()
	switch {
	case err == nil:
		c.obs.uncommittedDeleted()
		return true
	case errors.Is(err, payload.ErrNotFound):
		return true
	}
	return false // busy (a reader's lease), or the store unreachable: later
}
