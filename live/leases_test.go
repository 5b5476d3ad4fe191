package live

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
)

// TestLeasesComputingNow: a key computing in one process shows, with its
// holder, renewals as they are heard, and leaves once committed; the
// rows are oldest first.
func TestLeasesComputingNow(t *testing.T) {
	s := startServer(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	a, err := NewAggregator(nc, WithLeases())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	cnc, err := coordinator.Connect(s.ClientURL(), coordinator.ModeDegrade)
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	router, err := payload.NewRouter("gpu-7", payload.TransportMemory, payload.NewMemoryStore("gpu-7", 0))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := coordinator.New(ctx, cnc, coordinator.WithNode("gpu-7"), coordinator.WithPayload(router),
		coordinator.WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
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
