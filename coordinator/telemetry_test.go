package coordinator

import (
	"context"
	"testing"

	"github.com/embcache/embcache/payload"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestMetricsMatchWhatHappened reads the metrics through a ManualReader:
// one compute, one local hit and one remote pull are counted as such.
func TestMetricsMatchWhatHappened(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	a := newCache(t, srv.ClientURL(), store, WithMeterProvider(mp), WithTracerProvider(tp))
	b := newCache(t, srv.ClientURL(), store, WithMeterProvider(mp), WithTracerProvider(tp))
	ctx := context.Background()
	var cnt counter
	a.GetOrCompute(ctx, "r", ref(1), cnt.fn(1))
	a.GetOrCompute(ctx, "r", ref(1), cnt.fn(1))
	b.GetOrCompute(ctx, "r", ref(1), cnt.fn(1))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	byPath := map[string]int64{}
	var pulled int64
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				switch m.Name {
				case "embcache.requests":
					p, _ := dp.Attributes.Value("path")
					byPath[p.AsString()] += dp.Value
				case "embcache.pull.bytes":
					pulled += dp.Value
				}
			}
		}
	}
	if byPath["computed"] != 1 || byPath["local-hit"] != 1 || byPath["remote-hit"] != 1 {
		t.Fatalf("requests by path %v", byPath)
	}
	if pulled != embedding(1).Size() {
		t.Fatalf("pulled %d bytes, want %d", pulled, embedding(1).Size())
	}
	if n := len(spans.Ended()); n != 3 {
		t.Fatalf("%d spans", n)
	}
	for _, s := range spans.Ended() {
		found := false
		for _, kv := range s.Attributes() {
			found = found || kv.Key == "embcache.path"
		}
		if !found {
			t.Fatalf("span %s has no path", s.Name())
		}
	}
}
