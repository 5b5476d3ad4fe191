package live

import (
	"context"
	"errors"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lagAsk bounds one poll's requests.
const lagAsk = time.Second

// lagPoller asks the reconciler's durable consumer how far behind it is.
type lagPoller struct {
	js jetstream.JetStream
}

func newLagPoller(nc *nats.Conn) (*lagPoller, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &lagPoller{js: js}, nil
}

// poll returns the lag: the events the consumer has not acknowledged and
// the age at now of the oldest of them (the first event after its
// acknowledgement floor that the stream still holds).
func (p *lagPoller) poll(ctx context.Context, now time.Time) Reconciler {
	ctx, cancel := context.WithTimeout(ctx, lagAsk)
	defer cancel()
	cons, err := p.js.Consumer(ctx, events.StreamName, reconciler.Durable)
	if err != nil {
		return Reconciler{Err: err.Error()}
	}
	info := cons.CachedInfo()
	r := Reconciler{LagEvents: info.NumPending + uint64(info.NumAckPending), LagKnown: true}
	if r.LagEvents == 0 {
		return r
	}
	stream, err := p.js.Stream(ctx, events.StreamName)
	if err != nil {
		return Reconciler{Err: err.Error()}
	}
	m, err := stream.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(">"))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		r.Err = err.Error()
	default:
		r.LagSec = max(0, now.Sub(m.Time).Seconds())
	}
	return r
}
