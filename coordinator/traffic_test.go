package coordinator

import (
	"context"
	"testing"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
)

// TestMessagesPerPath holds the NATS messages a process receives per
// request to their budget (docs/scaling.md): a miss is answered three
// times (the key's read, the reservation, the commit), a remote hit twice
// (the record's read and its tombstone's); their events are not answered
// but for one in events.AckEvery. Each process's first event is the
// acknowledged one, so the keys after it cost only their reads and writes.
func TestMessagesPerPath(t *testing.T) {
	s := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := eventCache(t, s.ClientURL(), store)
	b := eventCache(t, s.ClientURL(), store)
	ctx := context.Background()
	var cnt counter
	get := func(c *Cache, i int, want Path) {
		t.Helper()
		if _, path, err := c.GetOrComputePath(ctx, "r", ref(i), cnt.fn(i)); err != nil || path != want {
			t.Fatalf("key %d: %v %v, want %v", i, path, err, want)
		}
	}
	get(a, 0, PathComputed) // the first published event: acknowledged
	get(b, 0, PathRemoteHit)
	// b's first event, the pull's touch, is owed until the interval's
	// end, and acknowledged: the touches of the hits below are not.
	waitFor(t, func() bool { return b.Stats().Publisher.Acknowledged == 1 })
	const n = events.AckEvery - 1
	// Besides the answers, an idle consumer's heartbeat may come.
	const slack = 2
	before := a.nc.Stats().InMsgs
	for i := 1; i <= n; i++ {
		get(a, i, PathComputed)
	}
	if got := a.nc.Stats().InMsgs - before; got < 3*n || got > 3*n+slack {
		t.Fatalf("%d misses: %d messages received, want %d (3 each)", n, got, 3*n)
	}
	before = b.nc.Stats().InMsgs
	for i := 1; i <= n; i++ {
		get(b, i, PathRemoteHit)
	}
	if got := b.nc.Stats().InMsgs - before; got < 2*n || got > 2*n+slack {
		t.Fatalf("%d remote hits: %d messages received, want %d (2 each)", n, got, 2*n)
	}
}
