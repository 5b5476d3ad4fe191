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
// there is one, and says where it is (source is the NATS URL to give
// embcache top). It listens to the cluster (every summary, and every
// lease record written) only while the page is open, on a connection
// dial opens when it starts and that is closed when it stops: the
// leases' traffic, up to every record write of the cluster
// (docs/scaling.md 5), does not queue on the node's connection, which
// the Cache and reconciler use.
func serveLiveView(tel *exporter.Exporter, dial func() (*nats.Conn, error), source string, out io.Writer) *liveui.Lazy {
	mux := tel.Mux()
	if mux == nil {
		return nil
	}
	lazy := liveui.NewLazy(func() (*live.Aggregator, func(), error) {
		nc, err := dial()
		if err != nil {
			return nil, nil, fmt.Errorf("live view: %w", err)
		}
		agg, err := live.NewAggregator(nc, live.WithLeases(), live.WithReconcilerLag())
		if err != nil {
			nc.Close()
			return nil, nil, fmt.Errorf("live view: %w", err)
		}
		return agg, nc.Close, nil
	}, liveViewIdle)
	liveui.Register(mux, lazy)
	fmt.Fprintf(out, "embcache serve: live view at http://%s/ (or: embcache top --nats %s)\n", tel.Addr, source)
	return lazy
}
