package main

import (
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
)

// TestAgentSummaryCountsItsClientsForwards: an agent's client computes
// (a lookup that reserves, then a commit) and another lookup hits. The
// agent's Cache counts the client's forward (its compute function waits
// for the commit) and the hit, not the reserving lookup, answered before
// the compute; the agent counts the commit. Its summary has the forward
// and both requests.
func TestAgentSummaryCountsItsClientsForwards(t *testing.T) {
	url, _, _ := startServe(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	agg, err := live.NewAggregator(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	dir := t.TempDir()
	socket := filepath.Join(dir, "agent.sock")
	out := startProcess(t, "agent", "--nats", url, "--node", "a1", "--shm-dir", filepath.Join(dir, "shm"),
		"--socket", socket, "--summary-interval", "200ms")
	waitOutput(t, out, "listening on ", "")
	c := agent.Dial(socket)
	ref := agent.KeyRef{Key: cachekey.Key{0x36, 0x01}.String(), Tenant: "acme", Model: "m", WeightEpoch: 1}
	resp, err := c.Lookup(ctx, ref, "r1")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	if _, err := c.Commit(ctx, resp.Reservation, "r1", "uint8", []int64{16}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if resp, err = c.Lookup(ctx, ref, "r2"); err != nil || resp.Status != agent.StatusHit {
		t.Fatalf("%+v %v", resp, err)
	}
	var st agent.Stats
	if st, err = c.Stats(ctx); err != nil || st.Cache.Computes != 1 || st.Agent.Commits != 1 || st.Cache.Requests["computed"] != 0 {
		t.Fatalf("the agent's stats: %+v %v", st, err)
	}
	want := maps.Clone(st.Cache.Requests)
	want["computed"] = 1
	var p live.Process
	for deadline := time.Now().Add(10 * time.Second); ; {
		for _, q := range agg.View().Processes {
			if q.Role == live.RoleAgent {
				p = q
			}
		}
		if p.Counters.Forwards == 1 && maps.Equal(p.Counters.Requests, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's summary: %+v; want requests %v", p.Counters, want)
		}
		time.Sleep(20 * time.Millisecond) // polling the view
	}
}
