package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SubscribeOptions selects what a subscription gets.
type SubscribeOptions struct {
	Tenants []string // only these tenants; empty means all
	Kinds   []Kind   // only these kinds; empty means all
	// Durable names a durable consumer: it resumes after a disconnect or a
	// restart from the first event it had not acknowledged. Empty means an
	// ordered (ephemeral) consumer.
	Durable string
	// New starts an ordered consumer at new events instead of the start:
	// at a time fixed when Subscribe asks (the stream leader's, less
	// newSkew), so that nothing published after it is lost if the consumer
	// is recreated before its first delivery (nats.go's ordered consumer
	// recreates a DeliverNew consumer as DeliverNew again, from the time of
	// the reset), nor on a stream deleted and created again meanwhile (its
	// sequences start again at 1). Events of the last newSkew before the
	// subscription may come too.
	New bool
	// Since, if set, starts an ordered consumer at the events the stream
	// stamped at or after it (by the stream leader's clock): a subscriber
	// that must hear every event since a time of its own passes that time
	// less how far its clock may be ahead of the leader's. Not with New.
	Since  time.Time
	Logger *slog.Logger
	// OnBad, if set, is called with the reason of each event skipped
	// because it did not decode (metrics count them), before it is
	// acknowledged.
	OnBad func(BadReason)
}

func (o SubscribeOptions) filters() []string {
	tenants, kinds := o.Tenants, o.Kinds
	if len(tenants) == 0 {
		tenants = []string{""}
	}
	if len(kinds) == 0 {
		kinds = []Kind{0}
	}
	var out []string
	for _, t := range tenants {
		for _, k := range kinds {
			out = append(out, Filter(t, k))
		}
	}
	return out
}

// newSkew is how far before the stream leader's time of the subscription a
// New subscription starts: a leader elected meanwhile stamps events by
// its own clock, which may be behind (servers' clocks are assumed to agree
// to well within this, as docs/protocol.md 3.1 assumes for lease TTLs).
// What it replays is harmless to a worker (an invalidation applied again
// drops copies of an invalidated model and epoch).
const newSkew = time.Second

// redeliverAfter is how long an event its handler could not apply waits
// before it is delivered again.
const redeliverAfter = time.Second

// Subscription delivers events to a handler until Stop.
type Subscription struct {
	cc       jetstream.ConsumeContext
	handled  atomic.Uint64
	bad      atomic.Uint64
	consumer jetstream.Consumer
}

// Subscribe calls handle for every event that matches opts, one at a time,
// acknowledging each (on a durable consumer) once handle has returned nil.
// An event handle returns an error for is not acknowledged but handed back
// (a Nak, redelivered after a second), to this subscription or whichever
// takes the durable consumer over: handle says nil once it has applied
// the event, not when it has queued it. An event that does not decode is
// counted (Bad), logged, passed to OnBad with its reason and
// acknowledged: it is skipped, never fatal.
func Subscribe(ctx context.Context, js jetstream.JetStream, opts SubscribeOptions, handle func(Event) error) (*Subscription, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	var cons jetstream.Consumer
	var err error
	if opts.Durable != "" {
		cons, err = js.CreateOrUpdateConsumer(ctx, StreamName, jetstream.ConsumerConfig{
			Durable:        opts.Durable,
			FilterSubjects: opts.filters(),
			AckPolicy:      jetstream.AckExplicitPolicy,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
			MaxAckPending:  1024,
		})
	} else {
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: opts.filters(), DeliverPolicy: jetstream.DeliverAllPolicy}
		if opts.New && !opts.Since.IsZero() {
			return nil, errors.New("events: subscribe with New or Since, not both")
		}
		if since := opts.Since; !since.IsZero() {
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
		}
		if opts.New {
			var st jetstream.Stream
			if st, err = js.Stream(ctx, StreamName); err != nil {
				return nil, fmt.Errorf("events: stream: %w", err)
			}
			start := st.CachedInfo().TimeStamp // the leader's clock, which stamps the events
			if start.IsZero() {
				start = time.Now()
			}
			start = start.Add(-newSkew)
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		}
		cons, err = js.OrderedConsumer(ctx, StreamName, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("events: consumer: %w", err)
	}
	s := &Subscription{consumer: cons}
	s.cc, err = cons.Consume(func(m jetstream.Msg) {
		e, err := Decode(m.Data())
		if err == nil && e.Subject() != m.Subject() {
			// Publish permissions are per subject (per tenant): a body
			// that names another tenant or key than its subject is refused.
			err = &DecodeError{Reason: BadInvalid, Err: fmt.Errorf("%w: subject %s, body says %s", ErrBadEvent, m.Subject(), e.Subject())}
		}
		if err != nil {
			s.bad.Add(1)
			reason := ReasonOf(err)
			logger.Warn("events: skipping an event that does not decode", "subject", m.Subject(), "reason", reason, "err", err)
			if opts.OnBad != nil {
				opts.OnBad(reason)
			}
		} else if herr := handle(e); herr != nil {
			if opts.Durable != "" {
				m.NakWithDelay(redeliverAfter)
			}
			return
		} else {
			s.handled.Add(1)
		}
		if opts.Durable != "" {
			m.Ack()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("events: consume: %w", err)
	}
	return s, nil
}

// Handled counts events passed to the handler.
func (s *Subscription) Handled() uint64 { return s.handled.Load() }

// Bad counts events skipped because they did not decode.
func (s *Subscription) Bad() uint64 { return s.bad.Load() }

// Stop ends the subscription and waits until the handler is no longer called.
func (s *Subscription) Stop() {
	s.cc.Stop()
	<-s.cc.Closed()
}
