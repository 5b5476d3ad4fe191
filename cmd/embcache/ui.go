package main

import (
	"fmt"
	"io"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/exporter"
	"github.com/embcache/embcache/cmd/embcache/internal/liveui"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
)

// liveViewIdle is how long serve keeps listening to the cluster after its
// page was last polled.
const liveViewIdle = 2 * time.Minute

// serveLiveView mounts the live view's page on the metrics listener, if
// there is one, and says where it is. It listens to the cluster (every
// summary, and every lease record written) only while the page is open.
func serveLiveView(tel *exporter.Exporter, nc *nats.Conn, out io.Writer) *liveui.Lazy {
	mux := tel.Mux()
	if mux == nil {
		return nil
	}
	lazy := liveui.NewLazy(func() (*live.Aggregator, error) {
		return live.NewAggregator(nc, live.WithLeases(), live.WithReconcilerLag())
	}, liveViewIdle)
	liveui.Register(mux, lazy)
	fmt.Fprintf(out, "embcache serve: live view at http://%s/ (or: embcache top --nats %s)\n", tel.Addr, nc.ConnectedUrlRedacted())
	return lazy
}
