package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/embcache/embcache/events"
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
	decodeInstruments
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
	if in.decodeInstruments, err = newDecodeInstruments(m); err != nil {
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

// pullFailed counts a pull that failed, by why.
func (in *instruments) pullFailed(err error) {
	in.pullErrors.Add(context.Background(), 1, pullReasonAttrs[pullReason(err)])
}

// Why a pull failed: a small fixed set, the pull errors' reason attribute.
const (
	pullNotFound    = "not_found"    // the payload is gone (payload.ErrNotFound)
	pullCorrupt     = "corrupt"      // its size or checksum differ from the record's (payload.ErrCorrupt)
	pullTooLarge    = "too_large"    // over the transport's size limit (payload.ErrTooLarge)
	pullUnavailable = "unavailable"  // the node holding it cannot be reached (payload.ErrUnavailable, payload.ErrClosed)
	pullNoTransport = "no_transport" // no transport here for the location (ErrNoTransport, payload.ErrInvalidLocation)
	pullCanceled    = "canceled"     // the caller's context ended first
	pullOther       = "other"        // anything else (a refused token, say): the log names it
)

var pullReasonAttrs = func() map[string]metric.MeasurementOption {
	m := map[string]metric.MeasurementOption{}
	for _, r := range []string{pullNotFound, pullCorrupt, pullTooLarge, pullUnavailable, pullNoTransport, pullCanceled, pullOther} {
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
	case errors.Is(err, payload.ErrUnavailable), errors.Is(err, payload.ErrClosed):
		return pullUnavailable
	case errors.Is(err, ErrNoTransport), errors.Is(err, payload.ErrInvalidLocation):
		return pullNoTransport
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return pullCanceled
	}
	return pullOther
}

// decodeInstruments count what a process decodes from the stream and the
// bucket, and what it cannot. A Cache and a Reconciler each make them; on
// one MeterProvider they are the same instruments.
type decodeInstruments struct {
	eventsDecoded metric.Int64Counter // by kind
	eventsBad     metric.Int64Counter // by reason
	recordsBad    metric.Int64Counter // by reason and op
}

func newDecodeInstruments(m metric.Meter) (decodeInstruments, error) {
	var d decodeInstruments
	var err error
	if d.eventsDecoded, err = m.Int64Counter("embcache.events.decoded", metric.WithUnit("{event}"),
		metric.WithDescription("events this process received from the stream and decoded, by kind")); err != nil {
		return d, err
	}
	if d.eventsBad, err = m.Int64Counter("embcache.events.bad", metric.WithUnit("{event}"),
		metric.WithDescription("events this process received that did not decode (skipped), by reason")); err != nil {
		return d, err
	}
	if d.recordsBad, err = m.Int64Counter("embcache.records.bad", metric.WithUnit("{record}"),
		metric.WithDescription("lease records that did not decode, by reason and by op: read (a key read) or watch (a change seen)")); err != nil {
		return d, err
	}
	// Every series is exported from the start, at 0 until it moves.
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

// Record ops: how a process came upon a record.
const (
	opRead  = "read"  // it read the key
	opWatch = "watch" // its watcher saw the change
)

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
	recordAttrs   = func() map[[2]string]metric.MeasurementOption {
		m := map[[2]string]metric.MeasurementOption{}
		for _, r := range recordReasons {
			for _, op := range []string{opRead, opWatch} {
				m[[2]string{r.String(), op}] = metric.WithAttributeSet(attribute.NewSet(
					attribute.String("reason", r.String()), attribute.String("op", op)))
			}
		}
		return m
	}()
)

func (d *decodeInstruments) eventDecoded(k events.Kind) {
	d.eventsDecoded.Add(context.Background(), 1, kindAttrs[k])
}

func (d *decodeInstruments) eventBad(r events.BadReason) {
	d.eventsBad.Add(context.Background(), 1, reasonAttrs[r])
}

// recordBad counts a record that did not decode (err wraps ErrBadRecord).
func (d *decodeInstruments) recordBad(err error, op string) {
	d.recordsBad.Add(context.Background(), 1, recordAttrs[[2]string{recordReason(err).String(), op}])
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

// reconcilerInstruments are a Reconciler's metrics.
type reconcilerInstruments struct {
	decodeInstruments
	actions   metric.Int64Counter       // by action
	elections metric.Int64Counter       // times this process became the active reconciler
	active    metric.Int64UpDownCounter // 1 while this process is the active reconciler, else 0
}

func newReconcilerInstruments(mp metric.MeterProvider) (*reconcilerInstruments, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	in := &reconcilerInstruments{}
	var err error
	if in.decodeInstruments, err = newDecodeInstruments(m); err != nil {
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
