package agent_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
)

// healthWithin polls /healthz until it answers want and returns how long
// that took since start; past limit it fails the test.
func healthWithin(t *testing.T, hc *http.Client, start time.Time, want int, limit time.Duration) time.Duration {
	t.Helper()
	for {
		code, _, _ := call(t, hc, "/healthz", "health", nil)
		if code == want {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("/healthz is %d %v after the change, want %d within %v", code, time.Since(start), want, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHealthzFollowsNATS: /healthz turns 503 within 2 s of the NATS server
// stopping, and 200 again once it is back on the same port.
func TestHealthzFollowsNATS(t *testing.T) {
	ns := startServer(t)
	n := startNode(t, ns.ClientURL(), "n1")
	hc := httpClient(t, n.socket)
	healthWithin(t, hc, time.Now(), http.StatusOK, 0)

	start := time.Now()
	ns.Shutdown()
	t.Logf("503 %v after shutdown began", healthWithin(t, hc, start, http.StatusServiceUnavailable, 2*time.Second))

	start = time.Now()
	if err := ns.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("200 %v after restart began", healthWithin(t, hc, start, http.StatusOK, 10*time.Second))
}

// TestHealthzSeesPartition: a server that goes silent without closing the
// connection leaves the client connected; /healthz still turns 503 within
// 2 s, because it asks the server for a round trip. Once the partition
// heals (the client reconnects), it is 200 again.
func TestHealthzSeesPartition(t *testing.T) {
	ns := startServer(t)
	b := startBlackhole(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	n := startNode(t, "nats://"+b.addr(), "n1")
	hc := httpClient(t, n.socket)
	healthWithin(t, hc, time.Now(), http.StatusOK, 0)

	start := time.Now()
	b.frozen.Store(true)
	t.Logf("503 %v after the partition", healthWithin(t, hc, start, http.StatusServiceUnavailable, 2*time.Second))

	start = time.Now()
	b.heal()
	t.Logf("200 %v after the partition healed", healthWithin(t, hc, start, http.StatusOK, 10*time.Second))
}

// blackhole relays TCP to a server until frozen, then drops every byte
// both ways without closing anything: a partition, as a client sees it.
type blackhole struct {
	l      net.Listener
	frozen atomic.Bool

	mu    sync.Mutex
	conns []net.Conn // guarded by mu
	wg    sync.WaitGroup
}

func startBlackhole(t *testing.T, server string) *blackhole {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{l: l}
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, s)
			b.mu.Unlock()
			b.wg.Go(func() { b.relay(s, c) })
			b.wg.Go(func() { b.relay(c, s) })
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-accepting // no connection is added after this
		b.heal()
		b.wg.Wait()
	})
	return b
}

// heal relays again and closes the connections that lost bytes, so that
// clients reconnect on a clean stream.
func (b *blackhole) heal() {
	b.frozen.Store(false)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
	b.conns = nil
}

func (b *blackhole) addr() string { return b.l.Addr().String() }

func (b *blackhole) relay(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.frozen.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A closing node's cache is, to the agent's client, a store it cannot
// reach (503 unavailable: the client computes without it), not an
// internal error.
func TestAClosedCacheIsUnavailable(t *testing.T) {
	srv := startServer(t)
	n := startNode(t, srv.ClientURL(), "n1")
	c := client(t, n)
	ref := keyOf(t, c, "closed")
	n.cache.Close()
	_, err := c.Lookup(context.Background(), ref, "r1")
	var ae *agent.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != "unavailable" {
		t.Fatalf("lookup on a closed cache: %v, want 503 unavailable", err)
	}
}
