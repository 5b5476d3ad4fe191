package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/embcache/embcache/internal/decodestats"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the package's spans and metrics.
const ScopeName = "github.com/embcache/embcache/coordinator"

// instruments are a Cache's metrics, in one place.
type instruments struct {
	*decodestats.Decode
	tracer        trace.Tracer
	requests      metric.Int64Counter     // by path
	computeTime   metric.Float64Histogram // seconds
	pullBytes     metric.Int64Counter
	pullTime      metric.Float64Histogram // seconds
	leaseWaits    metric.Int64Counter
	localEvicted  metric.Int64Counter // by cause
	pullErrors    metric.Int64Counter // by reason
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
	if in.Decode, err = decodestats.NewDecode(m); err != nil {
		return nil, err
	}
	if in.pullErrors, err = m.Int64Counter("embcache.pull.errors", metric.WithUnit("{pull}"),
		metric.WithDescription("committed payloads that could not be pulled or verified, by reason")); err != nil {
		return nil, err
	}
	for _, a := range pullReasonAttrs {
		in.pullErrors.Add(context.Background(), 0, a)
	}
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
		if l := c.eventLink(); l != nil {
			ps := l.pub.Stats()
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

// pullFailed counts a pull that failed, by why.
func (in *instruments) pullFailed(err error) {
	in.pullErrors.Add(context.Background(), 1, pullReasonAttrs[pullReason(err)])
}

// Why a pull failed: a small fixed set, the pull errors' reason attribute.
const (
	pullNotFound    = "not_found"         // the payload is gone (payload.ErrNotFound)
	pullCorrupt     = "corrupt"           // its size or checksum differ from the record's (payload.ErrCorrupt)
	pullTooLarge    = "too_large"         // over the transport's size limit (payload.ErrTooLarge)
	pullUnavailable = "unavailable"       // the node holding it cannot be reached (payload.ErrUnavailable, payload.ErrClosed)
	pullUnreachable = "store_unreachable" // this process cannot reach the store at all (payload.ErrStoreUnreachable): the record stays
	pullNoTransport = "no_transport"      // no transport here for the location (ErrNoTransport, payload.ErrInvalidLocation)
	pullUntrusted   = "untrusted"         // its address is not one this node pulls from (payload.ErrUntrusted): nothing was sent there
	pullCanceled    = "canceled"          // the caller's context ended first
	pullOther       = "other"             // anything else (a refused token, say): the log names it
)

var pullReasonAttrs = func() map[string]metric.MeasurementOption {
	m := map[string]metric.MeasurementOption{}
	for _, r := range []string{pullNotFound, pullCorrupt, pullTooLarge, pullUnreachable, pullUnavailable, pullNoTransport, pullUntrusted, pullCanceled, pullOther} {
		m[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	return m
}()

func pullReason(err error) string {
	switch {
	case errors.Is(err, payload.ErrNotFound):
		return pullNotFound
	case errors.Is(err, payload.ErrCorrupt):
		return pullCorrupt
	case errors.Is(err, payload.ErrTooLarge):
		return pullTooLarge
	case errors.Is(err, payload.ErrStoreUnreachable):
		return pullUnreachable
	case errors.Is(err, payload.ErrUnavailable), errors.Is(err, payload.ErrClosed):
		return pullUnavailable
	case errors.Is(err, ErrNoTransport), errors.Is(err, payload.ErrInvalidLocation):
		return pullNoTransport
	case errors.Is(err, payload.ErrUntrusted):
		return pullUntrusted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return pullCanceled
	}
	return pullOther
}

func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrStoreUnavailable):
		return "store_unavailable"
	case errors.Is(err, ErrComputeTimeout):
		return "compute_timeout"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "context"
	}
	return "compute"
}
