package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/exporter"
)

// startTelemetry starts the exporters of command ("serve": service
// embcache-serve) and tells w where /metrics is.
func startTelemetry(ctx context.Context, command, listen string, w io.Writer) (*exporter.Exporter, error) {
	e, err := exporter.Start(ctx, "embcache-"+command, listen)
	if err == nil && e.Addr != "" {
		fmt.Fprintf(w, "embcache %s: metrics at http://%s/metrics\n", command, e.Addr)
	}
	return e, err
}

// stopTelemetry flushes the exporters, waiting at most 5s.
func stopTelemetry(e *exporter.Exporter) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "embcache: telemetry shutdown:", err)
	}
}
