package reconciler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]reconciler.Option{
		"lease TTL under 1s": reconciler.WithLeaseTTL(500 * time.Millisecond),
		"no node":            reconciler.WithNode(""),
		"replicas":           reconciler.WithReplicas(7),
		"nil deleter":        reconciler.WithDeleter("shm", nil),
		"nil clock":          reconciler.WithClock(nil),
		"events max bytes":   reconciler.WithEventsMaxBytes(-1),
		"events under 1 MiB": reconciler.WithEventsMaxBytes(1000),
		"store TTL 0":        reconciler.WithStoreTTL(0),
		"store TTL 2 days":   reconciler.WithStoreTTL(48 * time.Hour),
		"restore every 0":    reconciler.WithRestoreEvery(0),
	} {
		if _, err := reconciler.New(&nats.Conn{}, opt); !errors.Is(err, reconciler.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := reconciler.New(nil); !errors.Is(err, reconciler.ErrInvalidOption) {
		t.Errorf("nil connection: %v", err)
	}
}

// run starts r until the returned stop is called (or the test ends).
func run(t *testing.T, r *reconciler.Reconciler) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond every 10ms for up to 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// One of two reconcilers is active; when it stops, the other takes over
// within about a lease TTL.
func TestOneActiveAndFailover(t *testing.T) {
	nc := natstest.Conn(t)
	opts := []reconciler.Option{reconciler.WithLeaseTTL(time.Second), reconciler.WithNode("test")}
	a, err := reconciler.New(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := reconciler.New(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stopA, stopB := run(t, a), run(t, b)
	waitFor(t, "an active reconciler", func() bool { return a.Stats().Active || b.Stats().Active })
	first, second, stopFirst := a, b, stopA
	if b.Stats().Active {
		first, second, stopFirst = b, a, stopB
	}
	if second.Stats().Active {
		t.Fatal("two active reconcilers")
	}
	stopFirst()
	waitFor(t, "the standby to take over", func() bool { return second.Stats().Active })
	if s := first.Stats(); s.Active || s.Elected != 1 {
		t.Fatalf("the stopped one: %+v", s)
	}
}
