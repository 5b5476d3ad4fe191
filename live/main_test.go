package live

import (
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newFakeClock is a clock the test moves, at a fixed start.
func newFakeClock() *fakeclock.Clock { return fakeclock.New(time.Unix(1_800_000_000, 0)) }

func startServer(t testing.TB) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// waitFor polls cond until it holds, for at most 10s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling another goroutine's state
	}
}

// runAggregator runs an Aggregator with opts on its own connection to
// url until the test ends; it returns the connection and the Aggregator.
func runAggregator(t *testing.T, url string, opts ...AggregatorOption) (*nats.Conn, *Aggregator) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := NewAggregator(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return nc, a
}

// startCache is a Cache of node gpu-7, values in memory, with leaseTTL,
// on its own connection to url, until the test ends.
func startCache(t *testing.T, url string, leaseTTL time.Duration) *coordinator.Cache {
	t.Helper()
	nc, err := coordinator.Connect(url, coordinator.ModeDegrade)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	router, err := payload.NewRouter("gpu-7", payload.TransportMemory, payload.NewMemoryStore("gpu-7", 0))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := coordinator.New(context.Background(), nc, coordinator.WithNode("gpu-7"), coordinator.WithPayload(router),
		coordinator.WithLeaseTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	return cache
}
