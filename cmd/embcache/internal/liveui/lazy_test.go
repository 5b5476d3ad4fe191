package liveui

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listening reports whether l's Aggregator runs.
func (l *Lazy) listening() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.agg != nil
}

// waitFor polls cond, held by another goroutine, until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling its goroutine
	}
}

// TestLazyListensOnlyWhileLookedAt: the first View starts the
// Aggregator on a connection of its own, a spell without one stops it
// and closes that connection, the next starts it again, and Close stops
// it for good; the page and its JSON are served.
func TestLazyListensOnlyWhileLookedAt(t *testing.T) {
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	var mu sync.Mutex
	var conns []*nats.Conn // one per start
	started := func() []*nats.Conn {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(conns)
	}
	l := NewLazy(func() (*live.Aggregator, func(), error) {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			return nil, nil, err
		}
		mu.Lock()
		conns = append(conns, nc)
		mu.Unlock()
		agg, err := live.NewAggregator(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return agg, nc.Close, nil
	}, 50*time.Millisecond)
	clock := fakeclock.New(time.Now()) // idle passes when the test says
	l.clock = clock
	mux := http.NewServeMux()
	Register(mux, l)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct{ path, want string }{{"/", "<title>embcache live</title>"}, {"/api/live", `"totals":`}} {
		resp, err := srv.Client().Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		buf := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(b.String(), c.want) {
			t.Fatalf("GET %s: %s, no %q", c.path, resp.Status, c.want)
		}
	}
	waitFor(t, "a View starts it", l.listening)
	if n := len(started()); n != 1 {
		t.Fatalf("%d started", n)
	}
	clock.Advance(time.Second)
	waitFor(t, "stopped once idle, its connection closed", func() bool {
		return !l.listening() && started()[0].IsClosed()
	})
	l.View()
	waitFor(t, "the next View starts it again", l.listening)
	if n := len(started()); n != 2 || started()[1].IsClosed() {
		t.Fatalf("%d started", n)
	}
	l.Close()
	if l.View(); l.listening() || len(started()) != 2 || !started()[1].IsClosed() {
		t.Fatal("running, or its connection open, after Close")
	}
}

// TestLazyClosesWhileStarting: Close while start dials waits for it and
// releases what it made; nothing runs after.
func TestLazyClosesWhileStarting(t *testing.T) {
	dialing, dialed := make(chan struct{}), make(chan struct{})
	released := make(chan struct{})
	l := NewLazy(func() (*live.Aggregator, func(), error) {
		close(dialing)
		<-dialed
		agg, err := live.NewAggregator(&nats.Conn{})
		return agg, func() { close(released) }, err
	}, time.Minute)
	l.View()
	<-dialing
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		l.Close()
	}()
	// Close waits for the start under way, which is not under the lock:
	// View answers meanwhile.
	waitFor(t, "closed", func() bool {
		l.View()
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.closed
	})
	close(dialed)
	<-closed
	select {
	case <-released:
	default:
		t.Fatal("Close returned before what start made was released")
	}
	if l.listening() {
		t.Fatal("running after Close")
	}
}
