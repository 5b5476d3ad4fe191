package events

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// Entry is what the events say of one value.
type Entry struct {
	Tenant   string
	Key      cachekey.Key
	Model    string
	Epoch    uint64
	Location payload.Location
	Expires  time.Time
}

// State folds events into the set of values the cluster holds. Apply the
// events in stream order. Safe for concurrent use.
type State struct {
	mu      sync.Mutex
	entries map[payload.ObjectID]held // guarded by mu
}

// held is a value's entry and the newest published or touched event that
// said it (which an ending is judged against).
type held struct {
	entry Entry
	by    Event
}

// NewState returns an empty state.
func NewState() *State { return &State{entries: make(map[payload.ObjectID]held)} }

// Apply folds one event in. Applying the same events twice in the same
// order gives the same state. An evicted event ends a value as Latest
// judges it: not one naming other bytes (an earlier value's, stored
// late); an abandoned event ends none (a failed compute published none).
func (s *State) Apply(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := payload.ObjectID{Tenant: e.Tenant, Key: e.Key}
	switch e.Kind {
	case KindPublished, KindTouched:
		old := s.entries[id].entry
		entry := entryOf(e)
		if old.Expires.After(entry.Expires) && old.Location.Checksum == entry.Location.Checksum {
			entry.Expires = old.Expires // a late touch never shortens a life
		}
		s.entries[id] = held{entry, e}
	case KindEvicted:
		if h, ok := s.entries[id]; ok && ends(e, h.by) {
			delete(s.entries, id)
		}
	case KindInvalidated:
		for id, h := range s.entries {
			if id.Tenant == e.Tenant && h.entry.Model == e.Model && h.entry.Epoch == e.Epoch {
				delete(s.entries, id)
			}
		}
	}
}

// Get returns the entry of id.
func (s *State) Get(id payload.ObjectID) (Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.entries[id]
	return h.entry, ok
}

// Live returns the entries that have not expired at now.
func (s *State) Live(now time.Time) map[payload.ObjectID]Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[payload.ObjectID]Entry, len(s.entries))
	for id, h := range s.entries {
		if h.entry.Expires.After(now) {
			out[id] = h.entry
		}
	}
	return out
}

// Replay reads the whole stream, from the start to its last event at the
// time of the call, into a fresh State. Events that do not decode are
// counted in skipped. The State holds every value the stream knows: for
// tools and tests; the reconciler reads what it needs by subject (Latest).
func Replay(ctx context.Context, js jetstream.JetStream) (state *State, skipped int, err error) {
	state = NewState()
	skipped, err = Scan(ctx, js, nil, state.Apply)
	if err != nil {
		return nil, skipped, fmt.Errorf("events: replay: %w", err)
	}
	return state, skipped, nil
}
