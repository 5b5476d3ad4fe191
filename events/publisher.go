package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("events: publisher closed")

// Publisher publishes events off the caller's path: a fixed number of
// workers drain a bounded queue. When the queue is full the event is
// dropped and counted (with a warning at most once per WarnEvery): the
// hot path never blocks and never spawns a goroutine per event.
//
// Of the events queued with Publish, one in AckEvery waits for the
// stream's acknowledgement; the others are plain publishes the stream
// stores without answering. Nothing retries a refused event either way
// (they are hints for the reconciler and the stream's readers, see
// docs/protocol.md 4.7), so an answer per event bought only a counter;
// one per AckEvery still tells a stream that refuses (no leader, no
// permission, deleted) within AckEvery events, counted and logged.
type Publisher struct {
	js      jetstream.JetStream
	queue   chan *nats.Msg
	logger  *slog.Logger
	timeout time.Duration

	queued                                   atomic.Uint64 // events taken by a worker: picks which are acknowledged
	published, acked, dropped, errs, invalid atomic.Uint64
	lastWarn, lastErrWarn                    atomic.Int64 // unix nanos of the last drop and error warnings

	mu     sync.RWMutex // guards closed against sends on a closed queue
	closed bool
	abort  chan struct{} // closed when Close gives up waiting: drop the rest
	wg     sync.WaitGroup
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	Published    uint64 // handed to the connection (Acknowledged of them confirmed stored)
	Acknowledged uint64 // acknowledged by the stream
	Dropped      uint64 // queue full
	Errors       uint64 // the publish failed, or the stream refused an acknowledged one
	Invalid      uint64 // the event did not validate
	Queued       int    // waiting now
}

// WarnEvery bounds the drop and error warnings.
const WarnEvery = 10 * time.Second

// AckEvery is how many events Publish sends per acknowledged one: the
// first, then every AckEvery-th.
const AckEvery = 64

// PublisherOptions configure a Publisher; the zero value of each field is
// its default.
type PublisherOptions struct {
	Workers int          // goroutines publishing (default 2)
	Queue   int          // events waiting, past which Publish drops (default 1024)
	Logger  *slog.Logger // drops and errors, at most every WarnEvery (default slog.Default())
}

// NewPublisher starts o.Workers goroutines draining a queue of o.Queue.
func NewPublisher(js jetstream.JetStream, o PublisherOptions) *Publisher {
	workers, queueSize, logger := o.Workers, o.Queue, o.Logger
	if workers < 1 {
		workers = 2
	}
	if queueSize < 1 {
		queueSize = 1024
	}
	if logger == nil {
		logger = slog.Default()
	}
	p := &Publisher{js: js, queue: make(chan *nats.Msg, queueSize), logger: logger, timeout: 5 * time.Second,
		abort: make(chan struct{})}
	for range workers {
		p.wg.Go(p.work)
	}
	return p
}

func (p *Publisher) work() {
	for msg := range p.queue {
		select {
		case <-p.abort:
			p.dropped.Add(1)
			continue
		default:
		}
		var err error
		if ack := (p.queued.Add(1)-1)%AckEvery == 0; ack {
			ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
			_, err = p.js.PublishMsg(ctx, msg)
			cancel()
			if err == nil {
				p.acked.Add(1)
			}
		} else {
			err = p.js.Conn().PublishMsg(msg)
		}
		if err != nil {
			n := p.errs.Add(1)
			p.warnEvery(&p.lastErrWarn, "events: publish failed; events sent since the last acknowledged one may be lost too",
				"subject", msg.Subject, "errors_total", n, "err", err)
			continue
		}
		p.published.Add(1)
	}
}

// Publish queues e and returns at once. It reports whether e was queued;
// a full queue drops it (counted), an invalid event is counted and refused.
func (p *Publisher) Publish(e *Event) bool {
	body, err := Encode(e)
	if err != nil {
		p.invalid.Add(1)
		p.logger.Warn("events: invalid event not published", "err", err)
		return false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		p.dropped.Add(1)
		return false
	}
	select {
	case p.queue <- &nats.Msg{Subject: e.Subject(), Data: body}:
		return true
	default:
		n := p.dropped.Add(1)
		p.warnEvery(&p.lastWarn, "events: publish queue full, dropping events", "dropped_total", n, "queue", cap(p.queue))
		return false
	}
}

// warnEvery logs msg at most once per WarnEvery; last holds when it was
// last logged (unix nanos).
func (p *Publisher) warnEvery(last *atomic.Int64, msg string, args ...any) {
	now := time.Now().UnixNano()
	if prev := last.Load(); now-prev >= int64(WarnEvery) && last.CompareAndSwap(prev, now) {
		p.logger.Warn(msg, args...)
	}
}

// PublishSync publishes e and waits for the stream's acknowledgement: for
// events that must not be dropped (invalidations).
func (p *Publisher) PublishSync(ctx context.Context, e *Event) error {
	body, err := Encode(e)
	if err != nil {
		return err
	}
	if _, err := p.js.PublishMsg(ctx, &nats.Msg{Subject: e.Subject(), Data: body}); err != nil {
		p.errs.Add(1)
		return fmt.Errorf("events: publishing %s: %w", e.Subject(), err)
	}
	p.published.Add(1)
	p.acked.Add(1)
	return nil
}

// Stats returns the counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Published: p.published.Load(), Acknowledged: p.acked.Load(), Dropped: p.dropped.Load(),
		Errors: p.errs.Load(), Invalid: p.invalid.Load(), Queued: len(p.queue)}
}

// Close stops taking events and waits for the queue to drain, until ctx
// ends; what is still queued then is counted as dropped. The events sent
// without acknowledgement are flushed to the server before it returns.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.queue)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return p.flush(ctx)
	case <-ctx.Done():
		left := len(p.queue)
		close(p.abort)
		<-done
		return fmt.Errorf("events: close: %d events left unpublished: %w", left, ctx.Err())
	}
}

// flush waits until the server has read what was sent without
// acknowledgement, until ctx ends (or the publish timeout, if ctx has no
// deadline). A reconnecting connection holds them in its buffer, sent only
// if it reconnects, which Close does not wait for: an error. A closed
// connection has nothing left to send.
func (p *Publisher) flush(ctx context.Context) error {
	nc := p.js.Conn()
	if p.published.Load() == p.acked.Load() || nc.IsClosed() {
		return nil
	}
	if nc.IsReconnecting() {
		return errors.New("events: close: not flushed: the connection is reconnecting; the events sent since the last acknowledged one wait in its buffer")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("events: close: not flushed: %w", err)
	}
	return nil
}
