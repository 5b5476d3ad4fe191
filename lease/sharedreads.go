package lease

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Reads of one tombstone are shared between the callers that ask for it at
// once, without weakening what each is told: a caller is answered by a
// read sent after it asked, never by one already in flight when it came
// (that one may have left before an invalidation the caller must see). A
// caller that comes while a read is in flight joins the next one, sent
// when that read is answered, for every caller that joined it. So a
// process makes at most two reads of a tombstone per round trip however
// many of its remote hits check it at once (docs/protocol.md 4.4).

// sharedReads are the tombstone reads of a Bucket in flight, by shard and
// key. The zero value is ready.
type sharedReads struct {
	mu     sync.Mutex
	groups map[sharedReadID]*sharedReadGroup // guarded by mu
}

type sharedReadID struct {
	shard int
	key   string
}

// sharedReadGroup is one key's reads: the one in flight, and the next,
// joined by the callers that came after it was sent.
type sharedReadGroup struct {
	inflight, next *sharedRead
}

type sharedRead struct {
	done    chan struct{} // closed when rev and err are set
	rev     uint64
	err     error
	joiners int       // guarded by sharedReads.mu: callers waiting for it (for tests)
	until   time.Time // guarded by sharedReads.mu: the latest deadline of its joiners (zero: one had none)
}

// sharedReadTimeout bounds a read made for callers that joined it of which
// one had no deadline (each waits only as long as its own context lets it).
const sharedReadTimeout = 10 * time.Second

// do returns read's answer from a read sent after do was called: its own,
// made with ctx, if none of id is in flight; otherwise the next one's.
func (s *sharedReads) do(ctx context.Context, id sharedReadID, read func(context.Context) (uint64, error)) (uint64, error) {
	s.mu.Lock()
	if s.groups == nil {
		s.groups = make(map[sharedReadID]*sharedReadGroup)
	}
	g := s.groups[id]
	if g == nil {
		g = &sharedReadGroup{}
		s.groups[id] = g
	}
	if g.inflight == nil {
		r := &sharedRead{done: make(chan struct{})}
		g.inflight = r
		s.mu.Unlock()
		s.run(ctx, id, g, r, read)
		return r.rev, r.err
	}
	if g.next == nil {
		g.next = &sharedRead{done: make(chan struct{}), until: time.Now()}
	}
	r := g.next
	r.joiners++
	if d, ok := ctx.Deadline(); !ok {
		r.until = time.Time{}
	} else if !r.until.IsZero() && d.After(r.until) {
		r.until = d
	}
	s.mu.Unlock()
	select {
	case <-r.done:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// run makes r, the group's read in flight, then sends the next one if a
// caller joined it (on a goroutine of its own: this caller has its
// answer, within the latest of its joiners' deadlines), or ends the group.
// A read that panics is an error for every caller of it, and the group
// goes on: left in flight, it would hold every later caller.
func (s *sharedReads) run(ctx context.Context, id sharedReadID, g *sharedReadGroup, r *sharedRead, read func(context.Context) (uint64, error)) {
	defer func() {
		if p := recover(); p != nil {
			r.rev, r.err = 0, fmt.Errorf("lease: tombstone read of %s panicked: %v", id.key, p)
		}
		s.mu.Lock()
		next := g.next
		g.inflight, g.next = next, nil
		var until time.Time
		if next == nil {
			delete(s.groups, id)
		} else if until = next.until; until.IsZero() {
			until = time.Now().Add(sharedReadTimeout)
		}
		s.mu.Unlock()
		close(r.done)
		if next != nil {
			go func() {
				ctx, cancel := context.WithDeadline(context.Background(), until)
				defer cancel()
				s.run(ctx, id, g, next, read)
			}()
		}
	}()
	r.rev, r.err = read(ctx)
}
