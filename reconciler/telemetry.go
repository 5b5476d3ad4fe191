package reconciler

import (
	"context"

	"github.com/embcache/embcache/internal/decodestats"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instruments are a Reconciler's metrics (docs/metrics.md).
type instruments struct {
	*decodestats.Decode
	actions   metric.Int64Counter       // by action
	elections metric.Int64Counter       // times this process became the active reconciler
	active    metric.Int64UpDownCounter // 1 while this process is the active reconciler, else 0
	discards  metric.Int64Counter       // by discard: looks at the event stream that found events needed discarded
}

func newInstruments(mp metric.MeterProvider) (*instruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	in := &instruments{}
	var err error
	if in.Decode, err = decodestats.NewDecode(m); err != nil {
		return nil, err
	}
	if in.actions, err = m.Int64Counter("embcache.reconciler.actions", metric.WithUnit("{action}"),
		metric.WithDescription("what the active reconciler did, by action")); err != nil {
		return nil, err
	}
	if in.elections, err = m.Int64Counter("embcache.reconciler.elections", metric.WithUnit("{election}"),
		metric.WithDescription("times this process became the active reconciler")); err != nil {
		return nil, err
	}
	if in.active, err = m.Int64UpDownCounter("embcache.reconciler.active",
		metric.WithDescription("1 while this process is the active reconciler, 0 while it stands by")); err != nil {
		return nil, err
	}
	if in.discards, err = m.Int64Counter("embcache.reconciler.stream_discards", metric.WithUnit("{check}"),
		metric.WithDescription("looks at the event stream that found events the reconciler needs discarded, by what")); err != nil {
		return nil, err
	}
	for d := range numDiscards {
		in.discards.Add(context.Background(), 0, discardAttrs[d])
	}
	in.active.Add(context.Background(), 0) // exported as 0 before the first election
	for a := range numActions {
		in.actions.Add(context.Background(), 0, actionAttrs[a]) // every action is exported, at 0 until it happens
	}
	return in, nil
}

var actionAttrs = func() [numActions]metric.MeasurementOption {
	var m [numActions]metric.MeasurementOption
	for a := range numActions {
		m[a] = metric.WithAttributeSet(attribute.NewSet(attribute.String("action", a.String())))
	}
	return m
}()

var discardAttrs = func() [numDiscards]metric.MeasurementOption {
	var m [numDiscards]metric.MeasurementOption
	for d := range numDiscards {
		m[d] = metric.WithAttributeSet(attribute.NewSet(attribute.String("what", d.String())))
	}
	return m
}()
