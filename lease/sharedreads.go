package lease

import (
	"context"
	"errors"
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
//
// A next read is sent on a goroutine of the Bucket's own (a follow-on:
// the caller whose read was answered has gone with its answer). close
// cancels the follow-ons in flight and waits for them, and sends none
// after it, so a closed Bucket leaves no goroutine behind to use the
// connection.

// sharedReads are the tombstone reads of a Bucket in flight, by shard and
// key. The zero value is ready.
type sharedReads[T any] struct {
	mu     sync.Mutex
	groups map[sharedReadID]*sharedReadGroup[T] // guarded by mu
	closed bool                                 // guarded by mu: no follow-on is started once set
	// base is the follow-ons' context, cancelled with ErrClosed by close
	// (stop); both made with the first follow-on. Guarded by mu.
	base context.Context
	stop context.CancelCauseFunc
	// followOns are the follow-ons' goroutines, added under mu while
	// closed is unset: close's Wait counts every one that starts.
	followOns sync.WaitGroup
}

type sharedReadID struct {
	shard int
	key   string
}

// sharedReadGroup is one key's reads: the one in flight, and the next,
// joined by the callers that came after it was sent.
type sharedReadGroup[T any] struct {
	inflight, next *sharedRead[T]
}

type sharedRead[T any] struct {
	done    chan struct{} // closed when val and err are set
	val     T
	err     error
	joiners int       // guarded by sharedReads.mu: callers waiting for it (for tests)
	until   time.Time // guarded by sharedReads.mu: the latest deadline of its joiners (zero: one had none)
}

// sharedReadTimeout bounds a read made for callers that joined it of which
// one had no deadline (each waits only as long as its own context lets it).
const sharedReadTimeout = 10 * time.Second

// do returns read's answer from a read sent after do was called: its own,
// made with ctx, if none of id is in flight; otherwise the next one's.
func (s *sharedReads[T]) do(ctx context.Context, id sharedReadID, read func(context.Context) (T, error)) (T, error) {
	var zero T
	s.mu.Lock()
	if s.groups == nil {
		s.groups = make(map[sharedReadID]*sharedReadGroup[T])
	}
	g := s.groups[id]
	if g == nil {
		g = &sharedReadGroup[T]{}
		s.groups[id] = g
	}
	if g.inflight == nil {
		// The caller's own read, on its own goroutine: made even after
		// close, as any read of the caller's is.
		r := &sharedRead[T]{done: make(chan struct{})}
		g.inflight = r
		s.mu.Unlock()
		s.run(ctx, id, g, r, read)
		return r.val, r.err
	}
	if s.closed {
		s.mu.Unlock()
		return zero, notSent(id)
	}
	if g.next == nil {
		g.next = &sharedRead[T]{done: make(chan struct{}), until: time.Now()}
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
		return r.val, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// run makes r, the group's read in flight, then sends the next one if a
// caller joined it (on a goroutine of its own: this caller has its
// answer, within the latest of its joiners' deadlines), or ends the group.
// A read that panics is an error for every caller of it, and the group
// goes on: left in flight, it would hold every later caller. Once closed,
// the next read is not sent: its joiners get ErrClosed, and the group ends.
func (s *sharedReads[T]) run(ctx context.Context, id sharedReadID, g *sharedReadGroup[T], r *sharedRead[T], read func(context.Context) (T, error)) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			r.val, r.err = zero, fmt.Errorf("lease: tombstone read of %s panicked: %v", id.key, p)
		}
		if r.err != nil && errors.Is(context.Cause(ctx), ErrClosed) { // a follow-on close cancelled
			r.err = fmt.Errorf("%w: tombstone read of %s cancelled: %w", ErrClosed, id.key, r.err)
		}
		s.mu.Lock()
		next := g.next
		var refused *sharedRead[T]
		if s.closed {
			next, refused = nil, next
		}
		g.inflight, g.next = next, nil
		var base context.Context
		var until time.Time
		if next == nil {
			delete(s.groups, id)
		} else {
			if s.base == nil {
				s.base, s.stop = context.WithCancelCause(context.Background())
			}
			base = s.base
			if until = next.until; until.IsZero() {
				until = time.Now().Add(sharedReadTimeout)
			}
			s.followOns.Add(1)
		}
		s.mu.Unlock()
		close(r.done)
		if refused != nil {
			refused.err = notSent(id)
			close(refused.done)
		}
		if next != nil {
			go func() {
				defer s.followOns.Done()
				ctx, cancel := context.WithDeadline(base, until)
				defer cancel()
				s.run(ctx, id, g, next, read)
			}()
		}
	}()
	r.val, r.err = read(ctx)
}

// close cancels the follow-ons in flight and returns once they have
// ended; no follow-on starts after it. Reads in flight on their callers'
// goroutines go on. Safe to call more than once, and at once.
func (s *sharedReads[T]) close() {
	s.mu.Lock()
	s.closed = true
	if s.stop != nil {
		s.stop(ErrClosed)
	}
	s.mu.Unlock()
	s.followOns.Wait()
}

// notSent is the error of a follow-on of id that close kept from being sent.
func notSent(id sharedReadID) error {
	return fmt.Errorf("%w: tombstone read of %s not sent", ErrClosed, id.key)
}
