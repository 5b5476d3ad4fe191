package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// telemetry owns a process's OpenTelemetry providers: metrics through the
// Prometheus exporter on /metrics, traces over OTLP/HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
type telemetry struct {
	mp     *metric.MeterProvider
	tp     *sdktrace.TracerProvider
	server *http.Server
	addr   string
}

func startTelemetry(ctx context.Context, service, listen string) (*telemetry, error) {
	res := resource.NewSchemaless(semconv.ServiceName(service))
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	t := &telemetry{mp: metric.NewMeterProvider(metric.WithReader(exp), metric.WithResource(res))}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		te, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(te), sdktrace.WithResource(res))
	}
	if listen != "" {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		t.addr = l.Addr().String()
		go t.server.Serve(l)
	}
	return t, nil
}

func (t *telemetry) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if t.server != nil {
		errs = append(errs, t.server.Shutdown(ctx))
	}
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	errs = append(errs, t.mp.Shutdown(ctx))
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "embcache: telemetry shutdown:", err)
	}
}
