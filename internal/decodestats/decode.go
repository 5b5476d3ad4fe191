// Package decodestats holds the counters that more than one process role
// exports: what a process decodes from the event stream and the lease
// bucket, and what it cannot (docs/metrics.md).
package decodestats

import (
	"context"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// RecordOp is how a process came upon a record.
type RecordOp string

// Record ops.
const (
	OpRead  RecordOp = "read"  // it read the key
	OpWatch RecordOp = "watch" // its watcher saw the change
)

// Decode counts what a process decodes from the stream and the bucket,
// and what it cannot. A Cache and a reconciler each make one; their
// meters name their own scopes.
type Decode struct {
	eventsDecoded metric.Int64Counter // by kind
	eventsBad     metric.Int64Counter // by reason
	recordsBad    metric.Int64Counter // by reason and op
}

// NewDecode makes the counters on m; every series is exported from the
// start, at 0 until it moves.
func NewDecode(m metric.Meter) (*Decode, error) {
	d := &Decode{}
	var err error
	if d.eventsDecoded, err = m.Int64Counter("embcache.events.decoded", metric.WithUnit("{event}"),
		metric.WithDescription("events this process received from the stream and decoded, by kind")); err != nil {
		return nil, err
	}
	if d.eventsBad, err = m.Int64Counter("embcache.events.bad", metric.WithUnit("{event}"),
		metric.WithDescription("events this process received that did not decode (skipped), by reason")); err != nil {
		return nil, err
	}
	if d.recordsBad, err = m.Int64Counter("embcache.records.bad", metric.WithUnit("{record}"),
		metric.WithDescription("lease records that did not decode, by reason and by op: read (a key read) or watch (a change seen)")); err != nil {
		return nil, err
	}
	ctx := context.Background()
	for _, k := range events.Kinds() {
		d.eventsDecoded.Add(ctx, 0, kindAttrs[k])
	}
	for _, r := range events.BadReasons() {
		d.eventsBad.Add(ctx, 0, reasonAttrs[r])
	}
	for _, a := range recordAttrs {
		d.recordsBad.Add(ctx, 0, a)
	}
	return d, nil
}

var (
	kindAttrs = func() map[events.Kind]metric.MeasurementOption {
		m := map[events.Kind]metric.MeasurementOption{}
		for _, k := range events.Kinds() {
			m[k] = metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", k.String())))
		}
		return m
	}()
	reasonAttrs = func() map[events.BadReason]metric.MeasurementOption {
		m := map[events.BadReason]metric.MeasurementOption{}
		for _, r := range events.BadReasons() {
			m[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r.String())))
		}
		return m
	}()
	// A record has no size limit of its own: the other reasons apply.
	recordReasons = []events.BadReason{events.BadMalformed, events.BadVersion, events.BadInvalid}
	recordAttrs   = func() map[recordAttr]metric.MeasurementOption {
		m := map[recordAttr]metric.MeasurementOption{}
		for _, r := range recordReasons {
			for _, op := range []RecordOp{OpRead, OpWatch} {
				m[recordAttr{r.String(), op}] = metric.WithAttributeSet(attribute.NewSet(
					attribute.String("reason", r.String()), attribute.String("op", string(op))))
			}
		}
		return m
	}()
)

// recordAttr keys the attribute sets of bad records.
type recordAttr struct {
	reason string
	op     RecordOp
}

// EventDecoded counts an event of kind k.
func (d *Decode) EventDecoded(k events.Kind) {
	d.eventsDecoded.Add(context.Background(), 1, kindAttrs[k])
}

// EventBad counts an event that did not decode.
func (d *Decode) EventBad(r events.BadReason) {
	d.eventsBad.Add(context.Background(), 1, reasonAttrs[r])
}

// RecordBad counts a record that did not decode (err wraps
// lease.ErrBadRecord), come upon by op (OpRead or OpWatch).
func (d *Decode) RecordBad(err error, op RecordOp) {
	d.recordsBad.Add(context.Background(), 1, recordAttrs[recordAttr{lease.BadReason(err).String(), op}])
}
