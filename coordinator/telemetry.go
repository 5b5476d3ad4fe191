package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/embcache/embcache/localcache"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the package's spans and metrics.
const ScopeName = "github.com/embcache/embcache/coordinator"

// instruments are the package's metrics, in one place.
type instruments struct {
	tracer        trace.Tracer
	requests      metric.Int64Counter     // by path
	computeTime   metric.Float64Histogram // seconds
	pullBytes     metric.Int64Counter
	pullTime      metric.Float64Histogram // seconds
	leaseWaits    metric.Int64Counter
	localEvicted  metric.Int64Counter // by cause
	requestTime   metric.Float64Histogram
	registrations []metric.Registration
}

func newInstruments(c *Cache, tp trace.TracerProvider, mp metric.MeterProvider) (*instruments, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	in := &instruments{tracer: tp.Tracer(ScopeName)}
	var err error
	if in.requests, err = m.Int64Counter("embcache.requests", metric.WithUnit("{request}"),
		metric.WithDescription("GetOrCompute calls by the path that answered them")); err != nil {
		return nil, err
	}
	if in.requestTime, err = m.Float64Histogram("embcache.request.duration", metric.WithUnit("s"),
		metric.WithDescription("GetOrCompute latency by path")); err != nil {
		return nil, err
	}
	if in.computeTime, err = m.Float64Histogram("embcache.compute.duration", metric.WithUnit("s"),
		metric.WithDescription("encoder forwards run by this process")); err != nil {
		return nil, err
	}
	if in.pullBytes, err = m.Int64Counter("embcache.pull.bytes", metric.WithUnit("By"),
		metric.WithDescription("payload bytes pulled from other processes")); err != nil {
		return nil, err
	}
	if in.pullTime, err = m.Float64Histogram("embcache.pull.duration", metric.WithUnit("s"),
		metric.WithDescription("payload pulls")); err != nil {
		return nil, err
	}
	if in.leaseWaits, err = m.Int64Counter("embcache.lease.waits", metric.WithUnit("{wait}"),
		metric.WithDescription("waits for another process's compute")); err != nil {
		return nil, err
	}
	if in.localEvicted, err = m.Int64Counter("embcache.local.evictions", metric.WithUnit("{entry}"),
		metric.WithDescription("local cache evictions by cause")); err != nil {
		return nil, err
	}
	queue, err := m.Int64ObservableGauge("embcache.events.queue", metric.WithUnit("{event}"),
		metric.WithDescription("events waiting in the publisher queue"))
	if err != nil {
		return nil, err
	}
	dropped, err := m.Int64ObservableCounter("embcache.events.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("events dropped because the publisher queue was full"))
	if err != nil {
		return nil, err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if ps, _, ok := c.EventStats(); ok {
			o.ObserveInt64(queue, int64(ps.Queued))
			o.ObserveInt64(dropped, int64(ps.Dropped))
		}
		return nil
	}, queue, dropped)
	if err != nil {
		return nil, err
	}
	in.registrations = append(in.registrations, reg)
	return in, nil
}

var pathAttrs = func() map[Path]metric.MeasurementOption {
	m := map[Path]metric.MeasurementOption{}
	for p := PathLocalHit; p <= PathDegraded; p++ {
		m[p] = metric.WithAttributeSet(attribute.NewSet(attribute.String("path", p.String())))
	}
	return m
}()

// request records one GetOrCompute: its span's outcome and the metrics.
func (in *instruments) request(ctx context.Context, span trace.Span, path Path, start time.Time, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String("error.type", errorType(err)))
	}
	if path != 0 {
		span.SetAttributes(attribute.String("embcache.path", path.String()))
		in.requests.Add(ctx, 1, pathAttrs[path])
		in.requestTime.Record(ctx, time.Since(start).Seconds(), pathAttrs[path])
	}
	span.End()
}

func (in *instruments) evicted(cause localcache.Cause) {
	in.localEvicted.Add(context.Background(), 1, metric.WithAttributes(attribute.String("cause", cause.String())))
}

func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrStoreUnavailable):
		return "store_unavailable"
	case errors.Is(err, localcache.ErrComputeTimeout):
		return "compute_timeout"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	}
	return "compute"
}
