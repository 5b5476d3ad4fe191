package coordinator

import (
	"context"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// watchHub runs one KV watcher for the whole bucket, decodes each change
// once (counting records that do not decode) and hands it to the key's
// waiters, so a waiter can act on a committed record without reading it
// again. Waiters also poll: a watcher can stall for seconds after a leader
// change, and a poll bounds that.
type watchHub struct {
	mu      sync.Mutex
	waiters map[string]map[chan *current]struct{} // by KV key; guarded by mu
	hooks   watchHooks
	cancel  context.CancelFunc
	stop    func() error
	quit    chan struct{}
	done    chan struct{}
}

// startWatchHub starts the watcher: of the whole bucket, or of one
// tenant's keys (filter "<tenant>.>"), which needs only that tenant's
// permissions. Its subscription lives as long as the context it is created
// with, so it gets one of its own, ended by close.
func startWatchHub(nc *nats.Conn, kv jetstream.KeyValue, filter string, hooks watchHooks) (*watchHub, error) {
	ctx, cancel := context.WithCancel(context.Background())
	var w jetstream.KeyWatcher
	var err error
	if filter == "" {
		w, err = kv.WatchAll(ctx, jetstream.UpdatesOnly())
	} else {
		w, err = kv.Watch(ctx, filter, jetstream.UpdatesOnly())
	}
	if err != nil {
		cancel()
		return nil, err
	}
	h := &watchHub{waiters: make(map[string]map[chan *current]struct{}), hooks: hooks,
		cancel: cancel, quit: make(chan struct{}), done: make(chan struct{})}
	// Stopping a watcher deletes its consumer: a request that waits out a
	// timeout while the server is away. Then the connection's owner
	// releases the subscription when it closes the connection.
	h.stop = func() error {
		if nc.IsConnected() {
			return w.Stop()
		}
		return nil
	}
	go func() {
		defer close(h.done)
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					st := h.state(e)
					h.hooks.changed(e.Key(), e.Revision(), st)
					h.wake(e.Key(), st)
				}
			case <-h.quit:
				return
			}
		}
	}()
	return h, nil
}

// state turns a watched change into a state, or nil if it says nothing
// usable (a delete, a marker, a record that does not decode).
func (h *watchHub) state(e jetstream.KeyValueEntry) *current {
	if e.Operation() != jetstream.KeyValuePut {
		return nil
	}
	rec, err := DecodeRecord(e.Value())
	if err != nil {
		h.hooks.bad(err)
		return nil
	}
	return &current{rev: e.Revision(), live: true, record: rec}
}

// subscribe returns a channel that gets the key's latest change: its
// state, or nil for a change that says nothing usable (read the key
// again). Call it before reading the key, so a change between the read
// and the wait is not missed; cancel when done.
func (h *watchHub) subscribe(key string) (<-chan *current, func()) {
	ch := make(chan *current, 1)
	h.mu.Lock()
	set := h.waiters[key]
	if set == nil {
		set = make(map[chan *current]struct{})
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

// wake hands a change of key to its waiters, replacing a change they have
// not taken yet: only the latest matters.
func (h *watchHub) wake(key string, st *current) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[key] {
		select {
		case <-ch:
		default:
		}
		ch <- st
	}
}

func (h *watchHub) close() {
	close(h.quit)
	h.stop()
	h.cancel()
	<-h.done
}

// watchHooks are called on a hub's goroutine, for every change it sees.
type watchHooks struct {
	bad     func(error)                               // a record that does not decode
	changed func(key string, rev uint64, st *current) // the key's new state at rev; nil: no usable record (deleted, purged, expired, bad)
}

// watchSet is the watchers of a Cache: one for the whole bucket, or one
// per served tenant.
type watchSet struct {
	hubs map[string]*watchHub // by tenant; "" is the whole bucket
}

func startWatchSet(nc *nats.Conn, kv jetstream.KeyValue, tenants []string, hooks watchHooks) (*watchSet, error) {
	ws := &watchSet{hubs: map[string]*watchHub{}}
	if len(tenants) == 0 {
		tenants = []string{""}
	}
	for _, t := range tenants {
		filter := ""
		if t != "" {
			filter = t + ".>"
		}
		h, err := startWatchHub(nc, kv, filter, hooks)
		if err != nil {
			ws.close()
			return nil, err
		}
		ws.hubs[t] = h
	}
	return ws, nil
}

// subscribe is watchHub.subscribe on the hub that sees key.
func (ws *watchSet) subscribe(key string) (<-chan *current, func()) {
	h := ws.hubs[""]
	if h == nil {
		tenant, _, _ := strings.Cut(key, ".")
		h = ws.hubs[tenant]
	}
	return h.subscribe(key)
}

func (ws *watchSet) close() {
	for _, h := range ws.hubs {
		h.close()
	}
}
