package live_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
)

// A process announces its counters; an operator's Aggregator sums every
// process it hears.
func Example() {
	dir, cleanup := tempDir()
	defer cleanup()
	srv, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	agg, err := live.NewAggregator(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// A library Cache opts in with live.FromCache(cache); this source
	// stands for one that answered 9 requests from its local cache and
	// computed 1.
	pub, err := live.NewPublisher(nc, "gpu-3", func() live.Summary {
		return live.Summary{Requests: map[string]uint64{"local-hit": 9, "computed": 1}, Forwards: 1}
	}, live.WithRole(live.RoleCache), live.WithInterval(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	for agg.View().Totals.Processes == 0 { // until the Aggregator's subscription is in
		pub.Publish()
		time.Sleep(10 * time.Millisecond)
	}
	t := agg.View().Totals
	fmt.Printf("%d process, %d requests, %d forwards, %d saved, hit ratio %.2f\n",
		t.Processes, t.Counters.Total, t.Counters.Forwards, t.Counters.Saved, *t.HitRatio)
	// Output: 1 process, 10 requests, 1 forwards, 9 saved, hit ratio 0.90
}
