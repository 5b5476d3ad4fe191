// Package exporter sets up a process's OpenTelemetry providers and where
// they export to: metrics as Prometheus text on GET /metrics, traces over
// OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is
// set (docs/metrics.md).
package exporter

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

// Exporter owns a process's providers. Shutdown flushes and stops them.
type Exporter struct {
	Meters *metric.MeterProvider
	Traces *sdktrace.TracerProvider // nil unless an OTLP endpoint is set
	Addr   string                   // where /metrics is served, or ""

	server *http.Server
	mux    *http.ServeMux
}

// Mux is the mux /metrics is served from (nil without a listener): a
// process adds its own pages to it (serve's live view).
func (e *Exporter) Mux() *http.ServeMux { return e.mux }

// Start makes the providers of service, and serves /metrics on listen
// unless it is "" (":0" picks a port: see Addr).
func Start(ctx context.Context, service, listen string) (*Exporter, error) {
	res := resource.NewSchemaless(semconv.ServiceName(service))
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	e := &Exporter{Meters: metric.NewMeterProvider(metric.WithReader(exp), metric.WithResource(res))}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		te, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		e.Traces = sdktrace.NewTracerProvider(sdktrace.WithBatcher(te), sdktrace.WithResource(res))
	}
	if listen != "" {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		e.server, e.mux = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, mux
		e.Addr = l.Addr().String()
		go e.server.Serve(l)
	}
	return e, nil
}

// Shutdown stops serving /metrics and flushes the providers, waiting at
// most until ctx ends.
func (e *Exporter) Shutdown(ctx context.Context) error {
	var errs []error
	if e.server != nil {
		errs = append(errs, e.server.Shutdown(ctx))
	}
	if e.Traces != nil {
		errs = append(errs, e.Traces.Shutdown(ctx))
	}
	errs = append(errs, e.Meters.Shutdown(ctx))
	return errors.Join(errs...)
}
