package coordinator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// slowPull is a payload transport whose Get takes longer than the record
// it pulls has left to live (the reader's clock moves on by d while it
// runs), then answers with what bad says (nil: the genuine value).
type slowPull struct {
	*payload.MemoryStore
	clock *fakeclock.Clock
	d     time.Duration
	bad   error
}

func (s slowPull) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	s.clock.Advance(s.d)
	if s.bad != nil {
		return nil, s.bad
	}
	return s.MemoryStore.Get(ctx, loc)
}

// TestReadersPurgeNoCommittedRecordPastItsExpiry: a reader does not purge
// a committed record (a payload it found corrupt, a record an invalidation
// made stale) that may have expired (lease.Record.MayHaveExpired): past
// the record's deadline the server may already have decided to expire it,
// and its marker would wipe the next holder's commit (docs/protocol.md
// 3.1). No clock skew here, only a pull that outlasts the record's life.
// The reader computes without sharing meanwhile. (It purged, however late.)
func TestReadersPurgeNoCommittedRecordPastItsExpiry(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bad        error
		invalidate bool
	}{
		{"corrupt", fmt.Errorf("%w: test", payload.ErrCorrupt), false},
		{"invalidated", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t)
			store := payload.NewMemoryStore("test-node", 0)
			const storeTTL = time.Hour
			writer := newCache(t, srv.ClientURL(), store, WithStoreTTL(storeTTL))
			ctx := context.Background()
			var cnt counter
			if _, err := writer.GetOrCompute(ctx, "w", ref(1), cnt.fn(1)); err != nil {
				t.Fatal(err)
			}
			writer.Release("w")
			committed := readRecord(t, writer, ref(1))
			if tc.invalidate {
				now := time.Now()
				tomb := lease.Record{V: lease.RecordVersion, State: lease.StateInvalidated, Owner: "cli", Started: now, Heartbeat: now, Model: "m", Epoch: 1}
				if err := writer.bucket().PutTombstone(ctx, "acme", "m", 1, tomb, lease.TombstoneTTL(storeTTL)); err != nil {
					t.Fatal(err)
				}
			}
			// The reader's clock agrees with the writer's, and moves on by the
			// store TTL while it pulls.
			clk := fakeclock.New(time.Now())
			slow := slowPull{MemoryStore: store, clock: clk, d: storeTTL, bad: tc.bad}
			reader := newCache(t, srv.ClientURL(), slow, WithStoreTTL(storeTTL), WithClock(clk))
			v, _, err := reader.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
			if err != nil {
				t.Fatal(err)
			}
			sameValue(t, v, 1)
			reader.Release("r")
			if !clk.Now().After(committed.Record.Expires) {
				t.Fatalf("the test's pull did not outlast the record (clock %v, expires %v)", clk.Now(), committed.Record.Expires)
			}
			if cur := readRecord(t, reader, ref(1)); cur.Rev != committed.Rev {
				t.Fatalf("the reader wrote on revision %d after its expiry (%v, by a clock that agrees with its writer's): the key is now at %d (%+v)",
					committed.Rev, committed.Record.Expires, cur.Rev, cur.Record.State)
			}
		})
	}
}

// TestAStoreTTLWithinFourClockAllowancesIsRefused: a committed record is
// touched only until two allowances before its expiry; a store TTL not
// well past that would let every value in use expire a store TTL after its
// commit, every time. (New accepted one within the allowance.)
func TestAStoreTTLWithinFourClockAllowancesIsRefused(t *testing.T) {
	srv := startServer(t)
	nc := connect(t, srv.ClientURL())
	c, err := New(context.Background(), nc, WithLeaseTTL(10*time.Second), WithClockAllowance(5*time.Second), WithStoreTTL(2*time.Second))
	if err == nil {
		c.Close()
		t.Fatal("a store TTL (2s) within the clock allowance (5s) was accepted")
	}
	if !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("%v, want ErrInvalidOption", err)
	}
}
