package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamName is the JetStream stream of events.
const StreamName = "EMBCACHE_EVENTS"

// Retention. The stream keeps the last event per subject (per tenant, kind
// and key), for MaxAge: longer than any value lives, since a touched event
// (which carries the location) is emitted at least once per touch interval
// while a value is hit. So a replay from the start sees, for every live
// value, the event that says where it is and until when, as long as the
// stream's MaxBytes holds every event of the last store TTL: past it, the
// stream discards its oldest events (docs/scaling.md says how to size it;
// the reconciler counts what it discards and restores the locations of
// live values from the bucket, docs/protocol.md 4.6).
//
// MaxAge is fixed: the longest store TTL (MaxStoreTTL, a rule every
// event's reader applies) and the tombstones' TTL follow from it.
const (
	MaxAge = 25 * time.Hour
	// DefaultMaxBytes is the stream's MaxBytes when it is created without
	// one (StreamConfig.MaxBytes 0).
	DefaultMaxBytes = 1 << 30
	// MinMaxBytes is the smallest MaxBytes a StreamConfig takes: a few
	// thousand events (they are 250-480 bytes stored; docs/scaling.md).
	MinMaxBytes = 1 << 20
)

// MaxStoreTTL is the longest store TTL a value may have: its last event
// must outlive it in the stream (MaxAge), or its expiry would find no
// event to say where its payload is. A published or touched event whose
// expiry is further than this past its own time is bad (a far-future
// expiry overflowed the record's TTL, which then expired at once).
const MaxStoreTTL = MaxAge - time.Hour

var (
	// ErrInvalidStreamConfig is returned for a StreamConfig out of range.
	ErrInvalidStreamConfig = errors.New("events: invalid stream config")
	// ErrStreamLimits is returned by EnsureLimits, without update, for a
	// stream whose limits are not the ones asked for.
	ErrStreamLimits = errors.New("events: the stream's limits differ")
)

// StreamConfig is what a process asks of the stream. The zero value is
// the defaults.
type StreamConfig struct {
	// Replicas of the stream when it is created (0: 1).
	Replicas int
	// MaxBytes is the stream's size limit, MinMaxBytes or more; 0 asks
	// for nothing: DefaultMaxBytes when the stream is created, whatever
	// it has otherwise. Past it the stream discards its oldest events.
	MaxBytes int64
}

// Validate checks c: the error wraps ErrInvalidStreamConfig.
func (c StreamConfig) Validate() error {
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("%w: replicas must be 1..5 (0: 1), got %d", ErrInvalidStreamConfig, c.Replicas)
	}
	if c.MaxBytes != 0 && c.MaxBytes < MinMaxBytes {
		return fmt.Errorf("%w: max bytes must be at least %d (1 MiB; 0: the stream's own, %d for a new one), got %d",
			ErrInvalidStreamConfig, MinMaxBytes, DefaultMaxBytes, c.MaxBytes)
	}
	return nil
}

// maxBytes is the MaxBytes a stream created with c gets.
func (c StreamConfig) maxBytes() int64 {
	if c.MaxBytes == 0 {
		return DefaultMaxBytes
	}
	return c.MaxBytes
}

// EnsureStream creates the stream with cfg if it is absent, and returns
// it. An existing stream is returned as it is, whatever its limits
// (EnsureLimits changes them). A bad cfg is an error wrapping
// ErrInvalidStreamConfig, and nothing is asked of the server.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, StreamName)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, err
	}
	s, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:              StreamName,
		Description:       "embcache events: published, touched, evicted, abandoned, invalidated",
		Subjects:          []string{SubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		Replicas:          max(cfg.Replicas, 1),
		MaxAge:            MaxAge,
		MaxBytes:          cfg.maxBytes(),
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, StreamName)
	}
	return s, err
}

// EnsureLimits gives the stream the MaxBytes cfg asks for (none if
// cfg.MaxBytes is 0). Only the operator's process updates the stream
// (update: the reconciler, whose user may): another process is told, by
// an error wrapping ErrStreamLimits, that the stream holds other limits,
// and leaves them. It reports whether it changed the stream. A stream
// made smaller than the events it holds discards its oldest at once.
func EnsureLimits(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, update bool) (changed bool, err error) {
	if err := cfg.Validate(); err != nil || cfg.MaxBytes == 0 {
		return false, err
	}
	s, err := js.Stream(ctx, StreamName)
	if err != nil {
		return false, fmt.Errorf("events: stream limits: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("events: stream limits: %w", err)
	}
	scfg := info.Config
	if scfg.MaxBytes == cfg.MaxBytes {
		return false, nil
	}
	if !update {
		return false, fmt.Errorf("%w: %s holds max bytes %d, not %d (the reconciler's process sets them: serve --events-max-bytes)",
			ErrStreamLimits, StreamName, scfg.MaxBytes, cfg.MaxBytes)
	}
	// The whole configuration is written back, as lease.EnsureRepublish
	// does: a stream update has no revision to check, so an operator's
	// edit at the same moment could be undone.
	scfg.MaxBytes = cfg.MaxBytes
	if _, err := js.UpdateStream(ctx, scfg); err != nil {
		return false, fmt.Errorf("events: stream limits: %w", err)
	}
	return true, nil
}

// Discarding reports whether a stream of info is at its MaxBytes: its
// next events push its oldest out (discard old), if they have not already.
// It is within the largest event (MaxEventSize, and its subject and the
// store's framing) of the limit.
func Discarding(info *jetstream.StreamInfo) bool {
	if info == nil || info.Config.MaxBytes <= 0 {
		return false
	}
	return info.State.Bytes+discardSlack >= uint64(info.Config.MaxBytes)
}

// discardSlack is how far below MaxBytes a stream that discards its
// oldest events may sit: one event of the largest size, with its subject
// and framing.
const discardSlack = MaxEventSize + 1024
