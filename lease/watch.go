package lease

import (
	"context"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// hub runs one KV watcher for the whole bucket (or one tenant's keys), decodes each change
// once (counting records that do not decode) and hands it to the key's
// waiters, so a waiter can act on a committed record without reading it
// again. Waiters also poll: a watcher can stall for seconds after a leader
// change, and a poll bounds that.
type hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan *Entry]struct{} // by KV key; guarded by mu
	hooks   WatchHooks
	cancel  context.CancelFunc
	stop    func() error
	quit    chan struct{}
	done    chan struct{}
}

// startHub starts the watcher: of the whole bucket, or of one tenant's
// keys (filter "<tenant>.>"), which needs only that tenant's permissions.
// Its subscription lives as long as the context it is created with, so it
// gets one of its own, ended by close.
func startHub(nc *nats.Conn, kv jetstream.KeyValue, filter string, hooks WatchHooks) (*hub, error) {
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
	h := &hub{waiters: make(map[string]map[chan *Entry]struct{}), hooks: hooks,
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
					if h.hooks.Changed != nil {
						h.hooks.Changed(e.Key(), e.Revision(), st)
					}
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
func (h *hub) state(e jetstream.KeyValueEntry) *Entry {
	if e.Operation() != jetstream.KeyValuePut {
		return nil
	}
	rec, err := DecodeRecord(e.Value())
	if err != nil {
		if h.hooks.Bad != nil {
			h.hooks.Bad(err)
		}
		return nil
	}
	return &Entry{Rev: e.Revision(), Live: true, Record: rec}
}

// subscribe returns a channel that gets the key's latest change: its
// state, or nil for a change that says nothing usable (read the key
// again). Call it before reading the key, so a change between the read
// and the wait is not missed; cancel when done.
func (h *hub) subscribe(key string) (<-chan *Entry, func()) {
	ch := make(chan *Entry, 1)
	h.mu.Lock()
	set := h.waiters[key]
	if set == nil {
		set = make(map[chan *Entry]struct{})
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
func (h *hub) wake(key string, st *Entry) {
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

func (h *hub) close() {
	close(h.quit)
	h.stop()
	h.cancel()
	<-h.done
}

// WatchHooks are called on a watcher's goroutine, for every change it
// sees; both are optional.
type WatchHooks struct {
	Bad     func(error)                             // a record that does not decode
	Changed func(key string, rev uint64, st *Entry) // the key's new state at rev; nil: no usable record (deleted, purged, expired, bad)
}

// Watch follows a bucket's changes and hands each key's to whoever waits
// on it (Subscribe), decoding each change once: one watcher for the whole
// bucket, or one per tenant. Waiters should also poll: a watcher can stall
// for seconds after a leader change.
type Watch struct {
	hubs map[string]*hub // by tenant; "" is the whole bucket
}

// StartWatch starts watching b: all of it, or only the keys of tenants
// (which needs only their permissions). Close it when done.
func StartWatch(b *Bucket, tenants []string, hooks WatchHooks) (*Watch, error) {
	ws := &Watch{hubs: map[string]*hub{}}
	if len(tenants) == 0 {
		tenants = []string{""}
	}
	for _, t := range tenants {
		filter := ""
		if t != "" {
			filter = t + ".>"
		}
		h, err := startHub(b.nc, b.kv, filter, hooks)
		if err != nil {
			ws.Close()
			return nil, err
		}
		ws.hubs[t] = h
	}
	return ws, nil
}

// Subscribe returns a channel that gets key's latest change: its state, or
// nil for a change that says nothing usable (read the key again). Call it
// before reading the key, so a change between the read and the wait is not
// missed; call the returned function when done.
func (ws *Watch) Subscribe(key string) (<-chan *Entry, func()) {
	h := ws.hubs[""]
	if h == nil {
		tenant, _, _ := strings.Cut(key, ".")
		h = ws.hubs[tenant]
	}
	return h.subscribe(key)
}

// Close stops the watchers.
func (ws *Watch) Close() {
	for _, h := range ws.hubs {
		h.close()
	}
}
