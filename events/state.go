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
	entries map[payload.ObjectID]Entry // guarded by mu
}

// NewState returns an empty state.
func NewState() *State { return &State{entries: make(map[payload.ObjectID]Entry)} }

// Apply folds one event in. Applying the same events twice in the same
// order gives the same state.
func (s *State) Apply(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := payload.ObjectID{Tenant: e.Tenant, Key: e.Key}
	switch e.Kind {
	case KindPublished, KindTouched:
		old := s.entries[id]
		entry := Entry{Tenant: e.Tenant, Key: e.Key, Model: e.Model, Epoch: e.Epoch, Location: *e.Location, Expires: e.Expires}
		if old.Expires.After(entry.Expires) && old.Location.Checksum == entry.Location.Checksum {
			entry.Expires = old.Expires // a late touch never shortens a life
		}
		s.entries[id] = entry
	case KindEvicted, KindAbandoned:
		delete(s.entries, id)
	case KindInvalidated:
		for id, entry := range s.entries {
			if id.Tenant == e.Tenant && entry.Model == e.Model && entry.Epoch == e.Epoch {
				delete(s.entries, id)
			}
		}
	}
}

// Get returns the entry of id.
func (s *State) Get(id payload.ObjectID) (Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	return e, ok
}

// Live returns the entries that have not expired at now.
func (s *State) Live(now time.Time) map[payload.ObjectID]Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[payload.ObjectID]Entry, len(s.entries))
	for id, e := range s.entries {
		if e.Expires.After(now) {
			out[id] = e
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
