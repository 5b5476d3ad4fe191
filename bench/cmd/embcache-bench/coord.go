package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// benchCoord measures the coordinator's two cluster-wide paths against the
// bare JetStream operations they are made of, on the same server: a miss
// (Reserve + Commit vs KV create + update) and a waiter's wake (from the
// start of a commit until the waiter has the value vs a KV put until its
// watcher delivery). On one node and a 3-node R3 cluster, SyncAlways on
// and off.
func benchCoord(quick bool) ([]benchRow, error) {
	rounds := 150
	if quick {
		rounds = 5
	}
	var rows []benchRow
	for _, replicas := range []int{1, 3} {
		for _, noSync := range []bool{false, true} {
			name := fmt.Sprintf("R%d sync=%s", replicas, map[bool]string{false: "always", true: "off"}[noSync])
			r, err := benchCoordOne(name, replicas, noSync, rounds)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			rows = append(rows, r...)
		}
	}
	return rows, nil
}

func benchCoordOne(name string, replicas int, noSync bool, rounds int) ([]benchRow, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "embcache-bench-coord-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var connect func() (*nats.Conn, error)
	if replicas == 1 {
		srv, err := embedded.Start(embedded.Options{StoreDir: dir, NoSync: noSync})
		if err != nil {
			return nil, err
		}
		defer srv.Shutdown()
		connect = func() (*nats.Conn, error) { return coordinator.Connect(srv.ClientURL(), coordinator.ModeDegrade) }
	} else {
		cl, err := embedded.StartCluster(ctx, replicas, dir, func(_ int, o *embedded.Options) { o.NoSync = noSync })
		if err != nil {
			return nil, err
		}
		defer cl.Shutdown()
		connect = func() (*nats.Conn, error) { return coordinator.Connect(cl.ClientURLs(), coordinator.ModeDegrade) }
	}
	store := payload.NewMemoryStore("bench", 0)
	plane, err := payload.NewRouter("bench", payload.TransportMemory, store)
	if err != nil {
		return nil, err
	}
	newCache := func(opts ...coordinator.Option) (*coordinator.Cache, func(), error) {
		nc, err := connect()
		if err != nil {
			return nil, nil, err
		}
		c, err := coordinator.New(ctx, nc, append([]coordinator.Option{coordinator.WithPayload(plane),
			coordinator.WithNode("bench"), coordinator.WithReplicas(replicas)}, opts...)...)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return c, func() { c.Close(); nc.Close() }, nil
	}
	holder, closeHolder, err := newCache()
	if err != nil {
		return nil, err
	}
	defer closeHolder()
	waiter, closeWaiter, err := newCache(coordinator.WithPollInterval(10 * time.Second))
	if err != nil {
		return nil, err
	}
	defer closeWaiter()
	nc, err := connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for _, c := range []*coordinator.Cache{holder, waiter} {
		if err := waitStoreReachable(ctx, c, 30*time.Second); err != nil {
			return nil, err
		}
	}
	var kv jetstream.KeyValue
	// A new R3 stream answers once its leader is elected: wait for the
	// first write of each bucket before measuring.
	if err := retryFor(30*time.Second, func() error {
		if kv == nil {
			if kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BARE", Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
				return err
			}
		}
		_, err := kv.Put(ctx, "warmup", []byte("x"))
		return err
	}); err != nil {
		return nil, err
	}
	watch, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	defer watch.Stop()
	value := payload.NewTensor(cachekey.Uint8, []int64{4096}, make([]byte, 4096))
	fn := func(context.Context) (*payload.Value, error) { return value, nil }
	var n uint64
	fresh := func() coordinator.Ref {
		n++
		var k cachekey.Key
		for i := range 8 {
			k[i] = byte(n >> (8 * i))
		}
		k[31] = byte(replicas)
		return coordinator.Ref{Tenant: "bench", Key: k, Model: "m"}
	}
	// A miss: reserve and commit a new key. On a new R3 cluster a leader
	// change can make a commit's answer unknown, and the lease is given up
	// (the fencing at work, docs/protocol.md 3.1): that round is taken again
	// on another key (its time counts the retry), at most twice.
	miss := func() error {
		var err error
		for range 3 {
			var l *coordinator.Reservation
			if l, err = holder.Reserve(ctx, fresh()); err != nil {
				return err
			}
			if _, err = l.Commit(ctx, value); !errors.Is(err, coordinator.ErrLeaseLost) {
				return err
			}
		}
		return err
	}
	if err := retryFor(30*time.Second, miss); err != nil {
		return nil, err
	}
	missTime, bareCAS, err := alternate(rounds, miss, func() error {
		key := fresh().KVKey()
		rev, err := kv.Create(ctx, key, []byte(`{"state":"computing"}`))
		if err != nil {
			return err
		}
		_, err = kv.Update(ctx, key, []byte(`{"state":"committed"}`), rev)
		return err
	})
	if err != nil {
		return nil, err
	}
	var wake, bareWake []time.Duration
	for range rounds {
		r := fresh()
		l, err := holder.Reserve(ctx, r)
		if err != nil {
			return nil, err
		}
		waits := waiter.Stats().Waits
		got := make(chan time.Time, 1)
		go func() {
			waiter.GetOrCompute(ctx, "bench", r, fn)
			got <- time.Now()
		}()
		for waiter.Stats().Waits == waits { // the waiter has seen "computing" and waits
			time.Sleep(50 * time.Microsecond)
		}
		commit := time.Now()
		if _, err := l.Commit(ctx, value); err != nil {
			return nil, err
		}
		wake = append(wake, (<-got).Sub(commit))
		waiter.Release("bench")
		put := time.Now()
		if _, err := kv.Put(ctx, r.KVKey(), []byte("x")); err != nil {
			return nil, err
		}
		<-watch.Updates()
		bareWake = append(bareWake, time.Since(put))
	}
	w, bw := medianDuration(wake), medianDuration(bareWake)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return []benchRow{
		{"coord", "miss (reserve+commit) " + name, us(missTime), us(bareCAS), "us", float64(missTime) / float64(bareCAS), "baseline: bare KV create + CAS update"},
		{"coord", "waiter wake " + name, us(w), us(bw), "us", float64(w) / float64(bw), "from commit start; baseline: bare KV put -> watch"},
	}, nil
}

func retryFor(limit time.Duration, fn func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStoreReachable waits until c reaches the KV bucket, for at most
// limit. The caches here are bare (a memory transport, no shm store), not
// nodes; a node waits with node.Node.Ready.
func waitStoreReachable(ctx context.Context, c *coordinator.Cache, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !c.Stats().StoreReachable {
		if time.Now().After(deadline) {
			return fmt.Errorf("store not reachable after %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
