package events

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamName is the JetStream stream of events.
const StreamName = "EMBCACHE_EVENTS"

// Retention. The stream keeps the last event per subject (per tenant, kind
// and key), for MaxAge: longer than any value lives, since a touched event
// (which carries the location) is emitted at least once per touch interval
// while a value is hit. So a replay from the start sees, for every live
// value, the event that says where it is and until when.
const (
	MaxAge   = 25 * time.Hour
	MaxBytes = 1 << 30
)

// MaxStoreTTL is the longest store TTL a value may have: its last event
// must outlive it in the stream (MaxAge), or its expiry would find no
// event to say where its payload is. A published or touched event whose
// expiry is further than this past its own time is bad (a far-future
// expiry overflowed the record's TTL, which then expired at once).
const MaxStoreTTL = MaxAge - time.Hour

// EnsureStream creates the stream if it is absent and returns it.
func EnsureStream(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, StreamName)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	if replicas < 1 {
		replicas = 1
	}
	s, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:              StreamName,
		Description:       "embcache events: published, touched, evicted, abandoned, invalidated",
		Subjects:          []string{SubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		MaxAge:            MaxAge,
		MaxBytes:          MaxBytes,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, StreamName)
	}
	return s, err
}
