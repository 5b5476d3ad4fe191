package agent_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/coordinator"
	embnode "github.com/embcache/embcache/node"
)

// TestRemoteHitPulledToShm: an agent whose cache pulls into its store
// (node.Options.PullToShm, as cmd/embcache agent runs) answers a value
// committed on another node with a file of its own store, bit-identical.
func TestRemoteHitPulledToShm(t *testing.T) {
	url := startServer(t).ClientURL()
	// Leases of 5 s: under make test's load a commit's write can take longer
	// than a 1 s lease less its allowance, and the protocol then gives the
	// key up (n2 would reserve it, not hit it).
	longLease := func(o *embnode.Options) { o.LeaseTTL = 5 * time.Second }
	n1 := startNode(t, url, "n1", longLease)
	n2 := startNode(t, url, "n2", longLease, func(o *embnode.Options) { o.PullToShm = true })
	c1, c2 := client(t, n1), client(t, n2)
	ctx := context.Background()
	ref := keyOf(t, c1, "pulled-to-shm")
	resp, err := c1.Lookup(ctx, ref, "r1")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	want := bytes.Repeat([]byte{5, 6, 7, 8}, 300_000)
	if _, err := c1.Commit(ctx, resp.Reservation, "r1", "uint8", []int64{int64(len(want))}, want); err != nil {
		t.Fatal(err)
	}
	near, err := c1.Lookup(ctx, ref, "r2")
	if err != nil || near.Status != agent.StatusHit {
		t.Fatalf("%+v %v", near, err)
	}
	far, err := c2.Lookup(ctx, ref, "r2")
	if err != nil || far.Status != agent.StatusHit || far.Path != coordinator.PathRemoteHit.String() {
		t.Fatalf("%+v %v", far, err)
	}
	if far.Value.File == near.Value.File || far.Value.Checksum != near.Value.Checksum ||
		!bytes.Equal(mapped(t, far.Value), want) {
		t.Fatalf("n2 answered %+v, n1 %+v", far.Value, near.Value)
	}
	if s := n2.cache.Stats(); s.RemoteHits != 1 || s.PayloadErrors != 0 {
		t.Fatalf("n2 stats %+v", s)
	}
}
