package lease

// Review tests (branch review): attacks on a2b2ad9, "a create whose
// caller stopped waiting is answered, and a key it took given back".

import (
	"context"
	"sync"
	"testing"
	"time"
)

// purgeWatch is the fixture's store, noting the fake time of every purge
// sent.
type purgeWatch struct {
	Store
	f      *fixture
	mu     sync.Mutex
	purges []time.Time
}

func (p *purgeWatch) Purge(ctx context.Context, key string, rev uint64) error {
	p.mu.Lock()
	p.purges = append(p.purges, p.f.clock.Now())
	p.mu.Unlock()
	return p.Store.Purge(ctx, key, rev)
}

// TestAGiveBackIsNeverSentAtOrPastTheDeadline: the op timeout (a
// minute) is longer than the lease TTL less the clock allowance. The
// create lands, its caller gone, with its answer (by the lease's clock)
// just before the deadline, at it, and past it: the give-back purge is
// sent only before the deadline, and a key answered at or past it is left
// to expire (docs/protocol.md 3.1: nothing is written on a revision at or
// after its deadline). (Checked: it holds.)
func TestAGiveBackIsNeverSentAtOrPastTheDeadline(t *testing.T) {
	f := newFixture(t, false)
	cfg := f.config()
	cfg.OpTimeout = time.Minute
	allowance := DefaultClockAllowance(cfg.TTL)
	for i, at := range []time.Duration{-time.Millisecond, 0, time.Millisecond} {
		ctx, cancel := context.WithCancel(context.Background())
		var deadline time.Time
		f.onNext("create", func(err error) error {
			// The create was sent at the clock's time before this answer.
			deadline = f.clock.Now().Add(cfg.TTL - allowance)
			f.clock.Advance(cfg.TTL - allowance + at)
			cancel()
			return err
		})
		w := &purgeWatch{Store: f.store(), f: f}
		rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n"}
		l, err := Acquire(ctx, w, kvKey(20+i), rec, cfg)
		if err == nil {
			l.Stop()
			t.Fatalf("answer %v from the deadline: Acquire returned a lease to a caller gone", at)
		}
		for _, p := range w.purges {
			if !p.Before(deadline) {
				t.Errorf("answer %v from the deadline: a purge sent %v after the deadline", at, p.Sub(deadline))
			}
		}
		if cur := f.read(t, kvKey(20+i)); at >= 0 && !cur.Live {
			t.Errorf("answer %v from the deadline: the key was given back at or past its deadline (%v)", at, err)
		}
		t.Logf("answer %v from the deadline: %v, %d purges", at, err, len(w.purges))
	}
}
