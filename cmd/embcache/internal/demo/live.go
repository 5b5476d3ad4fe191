package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/liveui"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
)

// serveLive serves the live view's page for the run, on a NATS
// connection of its own (the page follows every lease write: not on the
// reconciler node's), and says where it is and how embcache top shows
// the same. The returned function stops it and closes its connection.
func serveLive(c Config, natsURL string, progress io.Writer) (func(), error) {
	listen := c.LiveListen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	nc, err := nats.Connect(natsURL, nats.Name("embcache demo page"))
	if err != nil {
		return nil, fmt.Errorf("live view: %w", err)
	}
	agg, err := live.NewAggregator(nc, live.WithLeases(), live.WithReconcilerLag())
	if err != nil {
		nc.Close()
		return nil, err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("live view listener: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		agg.Run(ctx)
	}()
	mux := http.NewServeMux()
	liveui.Register(mux, agg)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	// The command as it was run (bin/embcache from make demo): one to paste.
	fmt.Fprintf(progress, "embcache demo: watch it live at http://%s/ or with: %s top --nats %s\n", l.Addr(), os.Args[0], natsURL)
	return func() {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		srv.Shutdown(sctx)
		scancel()
		cancel()
		<-ran
		nc.Close()
	}, nil
}

// hold sends the workload again and again, each round with inputs the
// cluster has not seen (so that forwards, waits and pulls go on beside
// the hits), until ctx ends.
func hold(ctx context.Context, c Config, procs []*proc, progress io.Writer) error {
	encoder, prefills := procs[0], procs[1:]
	fmt.Fprintln(progress, "embcache demo: holding the cluster, sending the workload round after round (Ctrl-C to stop)")
	for round := 1; ctx.Err() == nil; round++ {
		images := workload.Requests(c.Requests, c.Unique, c.Zipf, c.Seed+uint64(round))
		err := drive(images, c.Concurrency, io.Discard, "", func(id, image int) error {
			if ctx.Err() != nil {
				return nil
			}
			image += round * c.Unique
			for _, p := range []*proc{encoder, prefills[id%len(prefills)]} {
				if _, err := p.call(Request{ID: (round+1)*2*c.Requests + id, Image: image, Cache: true}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return ctx.Err()
}
