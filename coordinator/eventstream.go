package coordinator

import (
	"context"
	"errors"

	"github.com/embcache/embcache/events"
	"github.com/nats-io/nats.go/jetstream"
)

// ensureEventStream creates the event stream if it is missing, with the
// limit this Cache was given (WithEventsMaxBytes), and returns it. A
// stream that holds another limit keeps it (the operator's process sets
// it): the Cache says so in its log.
func (c *Cache) ensureEventStream(ctx context.Context) (jetstream.Stream, error) {
	cfg := events.StreamConfig{Replicas: c.s.replicas, MaxBytes: c.s.eventsMaxBytes}
	stream, err := events.EnsureStream(ctx, c.js, cfg)
	if err != nil || cfg.MaxBytes == 0 {
		return stream, err
	}
	if _, err := events.EnsureLimits(ctx, c.js, cfg, false); errors.Is(err, events.ErrStreamLimits) {
		c.s.logger.Warn("embcache: the event stream's limit is not this process's (--events-max-bytes): it keeps its own", "err", err)
	}
	return stream, nil
}
