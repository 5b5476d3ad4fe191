package agent

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/embcache/embcache/coordinator"
)

const (
	// healthProbe bounds the round trip to NATS that a health check makes.
	healthProbe = time.Second
	// healthEvery is how long a probe's answer is reused, so that a flood
	// of checks sends NATS at most one ping per interval. With healthProbe
	// it bounds how late a silent server loss is seen: 1.5 s.
	healthEvery = 500 * time.Millisecond
)

// health answers GET /healthz: 200 while the store is reachable, 503
// otherwise.
type health struct {
	cache *coordinator.Cache

	mu  sync.Mutex // held across a probe: concurrent checks wait for it
	at  time.Time  // when err was found; guarded by mu
	err error      // the last probe's answer; guarded by mu
}

func newHealth(c *coordinator.Cache) *health { return &health{cache: c} }

func (h *health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if err := h.check(); err != nil {
		http.Error(w, "store unreachable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}

// check asks the connection's state every time (free, and what sees a
// server that closed the connection at once) and the server itself at
// most every healthEvery.
func (h *health) check() error {
	if !h.cache.Stats().StoreReachable {
		return coordinator.ErrStoreUnavailable
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.at.IsZero() && time.Since(h.at) < healthEvery {
		return h.err
	}
	// Not the request's context: the answer is shared, and one caller
	// going away must not be cached as the store's failure.
	ctx, cancel := context.WithTimeout(context.Background(), healthProbe)
	defer cancel()
	h.err = h.cache.Ping(ctx)
	h.at = time.Now()
	return h.err
}
