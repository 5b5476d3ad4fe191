package live

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeasesComputingNow: a key computing in one process shows, with its
// holder, renewals as they are heard, and leaves once committed; the
// rows are oldest first.
func TestLeasesComputingNow(t *testing.T) {
	s := startServer(t)
	_, a := runAggregator(t, s.ClientURL(), WithLeases())
	ctx := context.Background()
	cache := startCache(t, s.ClientURL(), time.Second)
	release := make(chan struct{})
	results := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := cache.GetOrCompute(ctx, "r", ref(i), func(context.Context) (*payload.Value, error) {
				<-release
				return payload.NewTensor(cachekey.Float32, []int64{4}, make([]byte, 16)), nil
			})
			results <- err
		}()
		// The second starts once the first shows: oldest first is then
		// a fact, not a race.
		waitFor(t, "lease shown", func() bool { return len(a.View().Leases) == i+1 })
	}
	v := a.View()
	first := ref(0).KVKey()
	if l := v.Leases[0]; l.Key != first || l.Holder != "gpu-7" || l.Started.After(v.Leases[1].Started) {
		t.Fatalf("leases %+v", v.Leases)
	}
	// A heartbeat every third of the lease TTL.
	waitFor(t, "a renewal heard", func() bool { return a.View().Leases[0].Renewals >= 1 })
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "leases gone once committed", func() bool { return len(a.View().Leases) == 0 })
}

func ref(i int) coordinator.Ref {
	var k cachekey.Key
	binary.LittleEndian.PutUint64(k[:], uint64(i)+1)
	return coordinator.Ref{Tenant: "acme", Key: k, Model: "m", Epoch: 1}
}

// TestLateRepublishBringsNoLeaseBack: a key's computing record heard
// again after its commit, as a new stream leader republishes what it
// applies of its predecessor's entries, does not show the lease again
// (it would stay for the rest of its TTL, a lease nobody holds).
func TestLateRepublishBringsNoLeaseBack(t *testing.T) {
	s := startServer(t)
	nc, a := runAggregator(t, s.ClientURL(), WithLeases())
	ctx := context.Background()
	// What the streams republish, kept to be sent again.
	stored := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(lease.StoredWildcard, stored)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	// A lease TTL longer than the test: a lease brought back would not
	// expire before it looks.
	cache := startCache(t, s.ClientURL(), time.Minute)
	compute := func(i int, release <-chan struct{}) <-chan error {
		result := make(chan error, 1)
		go func() {
			_, err := cache.GetOrCompute(ctx, "r", ref(i), func(context.Context) (*payload.Value, error) {
				<-release
				return payload.NewTensor(cachekey.Float32, []int64{4}, make([]byte, 16)), nil
			})
			result <- err
		}()
		return result
	}
	release := make(chan struct{})
	result := compute(0, release)
	waitFor(t, "lease shown", func() bool { return len(a.View().Leases) == 1 })
	var reservation *nats.Msg
	for reservation == nil {
		m := <-stored
		if key, c, ok := lease.DecodeStored(m); ok && key == ref(0).KVKey() && c.Entry.Live && c.Entry.Record.State == lease.StateComputing {
			reservation = m
		}
	}
	sub.Unsubscribe()
	close(release)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lease gone once committed", func() bool { return len(a.View().Leases) == 0 })
	// The reservation again, late; then another key's: the Aggregator
	// hears them in that order (one connection, one subscription), so
	// once the second shows, the first has been taken.
	if err := nc.PublishMsg(&nats.Msg{Subject: reservation.Subject, Header: reservation.Header, Data: reservation.Data}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	release = make(chan struct{})
	result = compute(1, release)
	waitFor(t, "the next lease shown", func() bool {
		for _, l := range a.View().Leases {
			if l.Key == ref(1).KVKey() {
				return true
			}
		}
		return false
	})
	if ls := a.View().Leases; len(ls) != 1 {
		t.Errorf("leases after a late republish of a committed key's reservation: %+v", ls)
	}
	close(release)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
}

// TestEndedLeasesAreForgotten: what ended a lease is kept only while a
// computing record stored before it could still be live, so that keys
// committed long ago cost the Aggregator nothing; a late record heard
// after that has outlived its TTL and is not shown either.
func TestEndedLeasesAreForgotten(t *testing.T) {
	clock := newFakeClock()
	a := newTestAggregator(t, clock)
	key, now := ref(0).KVKey(), clock.Now()
	rec := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: "gpu-7/1/n", Nonce: "n",
		Started: now, Heartbeat: now}
	a.receiveStored(storedMsg(t, key, 1, now, 5*time.Second, &rec))
	if v := a.View(); len(v.Leases) != 1 {
		t.Fatalf("reserved: %+v", v.Leases)
	}
	clock.Advance(time.Second)
	a.receiveStored(storedMsg(t, key, 2, clock.Now(), 0, nil)) // its delete
	a.receiveStored(storedMsg(t, key, 1, now, 5*time.Second, &rec))
	if v := a.View(); len(v.Leases) != 0 {
		t.Fatalf("the reservation heard again after its delete: %+v", v.Leases)
	}
	clock.Advance(5*time.Second + expiryMargin + time.Millisecond) // past the delete's stamp by a TTL
	a.View()
	a.mu.Lock()
	kept := len(a.ended)
	a.mu.Unlock()
	if kept != 0 {
		t.Fatalf("%d ended leases still kept", kept)
	}
	a.receiveStored(storedMsg(t, key, 1, now, 5*time.Second, &rec))
	if v := a.View(); len(v.Leases) != 0 {
		t.Fatalf("the reservation heard again after its TTL: %+v", v.Leases)
	}
}

// storedMsg is what a shard's stream republishes for key at rev: rec, or
// a delete marker if rec is nil.
func storedMsg(t *testing.T, key string, rev uint64, stamp time.Time, ttl time.Duration, rec *lease.Record) *nats.Msg {
	t.Helper()
	m := nats.NewMsg("embcache.stored.EMBCACHE." + key)
	m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(rev, 10))
	m.Header.Set(jetstream.TimeStampHeaer, stamp.Format(time.RFC3339Nano))
	if ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	}
	if rec == nil {
		m.Header.Set("KV-Operation", "DEL")
		return m
	}
	var err error
	if m.Data, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	return m
}
