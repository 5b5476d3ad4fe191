//go:build mooncake && cgo

package coordinator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/internal/mooncaketest"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/mooncake"
)

// slowMooncakePut is slowPut over a real Mooncake Store.
type slowMooncakePut struct {
	*mooncake.Store
	clock *fakeclock.Clock
	by    time.Duration
	put   *payload.Location // the last Put's
}

func (s slowMooncakePut) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	loc, err := s.Store.Put(ctx, obj, v)
	*s.put = loc
	s.clock.Advance(s.by)
	return loc, err
}

// openRealMooncake starts a real Mooncake master whose read leases last
// 1 s (--default_kv_lease_ttl) and opens a store on it that holds its own
// 64 MiB segment, closed at the test's end.
func openRealMooncake(t *testing.T) *mooncake.Store {
	t.Helper()
	dir := mooncaketest.Dir(t)
	master := mooncaketest.StartMaster(t, dir, "--default_kv_lease_ttl=1000")
	store, err := mooncake.Open(mooncake.Config{Library: mooncaketest.Library(dir), Node: "test-node",
		LocalHostname: "127.0.0.1", MetadataServer: master.Metadata, Protocol: "tcp", MasterServerAddr: master.Addr,
		GlobalSegmentSize: 64 << 20, LocalBufferSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// A refused commit's object is removed from a real Mooncake Store, which
// lists nothing and keeps an object until it is removed or evicted. The
// removal's own check of the bytes leases the object (1 s here,
// --default_kv_lease_ttl): it is removed by a later try, unforced.
func TestARefusedCommitsMooncakeObjectIsRemoved(t *testing.T) {
	store := openRealMooncake(t)
	srv := startServer(t)
	clock := fakeclock.New(time.Now())
	var put payload.Location
	c, err := New(context.Background(), connect(t, srv.ClientURL()),
		route(t, payload.TransportMooncake, slowMooncakePut{store, clock, 2 * time.Second, &put}), WithNode("test-node"),
		WithLeaseTTL(time.Second), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	commitPastItsLease(t, c, 1)
	settleUncommitted(t, c)
	if s := c.Stats(); s.UncommittedDeleted != 1 || s.UncommittedLeft != 0 {
		t.Fatalf("uncommitted deleted %d, left %d; want 1, 0", s.UncommittedDeleted, s.UncommittedLeft)
	}
	if _, err := store.Get(ctx, put); !errors.Is(err, payload.ErrNotFound) {
		t.Fatalf("the refused commit's object after its removal: %v, want ErrNotFound", err)
	}
}
