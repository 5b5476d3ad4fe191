package lease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/lease"
	"github.com/nats-io/nats.go"
)

// Two processes race for a key: the first takes its lease, the second
// finds it held; once the first abandons it, the key is free again.
func Example() {
	dir, _ := os.MkdirTemp("", "embcache-lease-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Options{StoreDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	ctx := context.Background()
	b, err := lease.OpenBucket(ctx, nc, lease.BucketConfig{Name: lease.DefaultBucket, MarkerTTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	record := func(owner string) lease.Record {
		now := time.Now()
		return lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: owner, Nonce: owner, Started: now, Heartbeat: now}
	}
	cfg := lease.Config{TTL: 5 * time.Second}

	first, err := lease.Acquire(ctx, b, "acme.job-1", record("first"), cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = lease.Acquire(ctx, b, "acme.job-1", record("second"), cfg)
	fmt.Println("second:", errors.Is(err, lease.ErrHeld))
	first.Abandon(ctx)
	second, err := lease.Acquire(ctx, b, "acme.job-1", record("second"), cfg)
	fmt.Println("after abandon:", err == nil, second.Revision() > first.Revision())
	second.Abandon(ctx)
	first.Stop()
	second.Stop()
	// Output:
	// second: true
	// after abandon: true true
}
