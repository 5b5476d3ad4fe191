package coordinator

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// watchHub runs one KV watcher for the whole bucket and wakes the waiters
// of a key when it changes. Waiters also poll: a watcher can stall for
// seconds after a leader change, and a poll bounds that.
type watchHub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{} // by KV key; guarded by mu
	stop    func() error
	done    chan struct{}
}

func startWatchHub(ctx context.Context, kv jetstream.KeyValue) (*watchHub, error) {
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	h := &watchHub{waiters: make(map[string]map[chan struct{}]struct{}), stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for e := range w.Updates() {
			if e != nil {
				h.wake(e.Key())
			}
		}
	}()
	return h, nil
}

// subscribe returns a channel that gets a value when key changes. Call it
// before reading the key, so a change between the read and the wait is
// not missed; cancel when done.
func (h *watchHub) subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	set := h.waiters[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		h.waiters[key] = set
	}
	set[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		// ch keeps its set in the map until it leaves, so the set is current.
		set := h.waiters[key]
		delete(set, ch)
		if len(set) == 0 {
			delete(h.waiters, key)
		}
		h.mu.Unlock()
	}
}

func (h *watchHub) wake(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[key] {
		select {
		case ch <- struct{}{}:
		default: // already signalled
		}
	}
}

func (h *watchHub) close() {
	h.stop()
	<-h.done
}
