package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/inspect"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
)

// unreachableGets is a shared payload store (Mooncake: one object per key
// for the cluster) that this process cannot reach: a master that does not
// answer it.
type unreachableGets struct{ *payload.MemoryStore }

func (unreachableGets) Get(context.Context, payload.Location) (*payload.Value, error) {
	return nil, fmt.Errorf("test: master down: %w (%w)", payload.ErrStoreUnreachable, payload.ErrUnavailable)
}

// Node n1 writes its values to a shared store (Mooncake; the memory
// transport here) and keeps the node's shm store in its routers, as
// node.openPayload does. Its agent cannot reach the store: a record a
// worker of n1 committed (value X) is kept, and the agent's client
// computes the key, unshared, with other bytes (X': an encoder whose
// output depends on its batch). The agent serves that copy as a hit and
// so places it in the node's shm store under the key's name. Another
// process of n1, which reaches the store, then reads the kept record: the
// copy of other bytes in the node's store is not the value's failure, X
// is read from the shared store, and the record stays
// (docs/protocol.md 3, rule 5).
func TestAnUnsharedHitPlacedInTheNodeStoreLeavesTheNodesRecord(t *testing.T) {
	url := startServer(t).ClientURL()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node, err := shm.Open(filepath.Join(dir, "shm"), shm.WithNode("n1"))
	if err != nil {
		t.Fatal(err)
	}
	shared := payload.NewMemoryStore("n1", 0)
	process := func(tr payload.Transport) *coordinator.Cache {
		t.Helper()
		nc, err := coordinator.Connect(url, coordinator.ModeDegrade)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		r, err := payload.NewRouter("n1", payload.TransportMemory, tr, payload.WithNodeStore(node))
		if err != nil {
			t.Fatal(err)
		}
		c, err := coordinator.New(ctx, nc, coordinator.WithPayload(r), coordinator.WithNode("n1"),
			coordinator.WithLeaseTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	agentCache := process(unreachableGets{shared})
	srv, err := agent.New(agentCache, node)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "agent.sock")
	ul, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ul) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	c := agent.Dial(socket)
	t.Cleanup(c.Close)
	kref := keyOf(t, c, "image-1")
	key, err := cachekey.Parse(kref.Key)
	if err != nil {
		t.Fatal(err)
	}
	ref := coordinator.Ref{Tenant: kref.Tenant, Key: key, Model: kref.Model, Epoch: kref.WeightEpoch}

	// A worker of n1 computes X and commits it to the shared store.
	x, x2 := bytes.Repeat([]byte{1, 2, 3, 4}, 1024), bytes.Repeat([]byte{1, 2, 3, 5}, 1024)
	tensor := func(b []byte) *payload.Value {
		return payload.NewTensor(cachekey.Float32, []int64{1024}, bytes.Clone(b))
	}
	worker := process(shared)
	if _, path, err := worker.GetOrComputePath(ctx, "w", ref, func(context.Context) (*payload.Value, error) { return tensor(x), nil }); err != nil || path != coordinator.PathComputed {
		t.Fatalf("the worker: %v %v", path, err)
	}
	worker.Release("w")
	before := recordRev(t, url, ref)

	// The agent's client: the record is kept, the client computes X'.
	resp, err := c.Lookup(ctx, kref, "r1")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("the agent's first lookup: %+v %v, want the compute handed to its client", resp, err)
	}
	var slot agent.SlotResponse
	if err := post(socket, "/v1/slot", agent.SlotRequest{Reservation: resp.Reservation, Size: int64(len(x2))}, &slot); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(slot.File, x2, 0o600); err != nil {
		t.Fatal(err)
	}
	var accepted agent.LookupResponse
	if err := post(socket, "/v1/commit", agent.CommitRequest{Reservation: resp.Reservation, Client: c.ID, RequestID: "r1",
		DType: "float32", Shape: []int64{1024}, Slot: slot.Slot}, &accepted); err != nil || accepted.Status != agent.StatusAccepted {
		t.Fatalf("commit: %+v %v", accepted, err)
	}
	// Another request of the agent's: a hit of its unshared copy.
	hit, err := c.Lookup(ctx, kref, "r2")
	if err != nil || hit.Status != agent.StatusHit || !bytes.Equal(mapped(t, hit.Value), x2) {
		t.Fatalf("the agent's second lookup: %+v %v, want a hit of its client's value", hit, err)
	}
	if s := agentCache.Stats(); s.Degraded != 1 {
		t.Fatalf("the agent's cache: %+v, want one degraded request", s)
	}
	if cur := recordRev(t, url, ref); cur != before {
		t.Fatalf("the agent's requests changed the record: rev %d -> %d", before, cur)
	}

	// Another process of n1, which reaches the store, reads the record.
	reader := process(shared)
	v, path, err := reader.GetOrComputePath(ctx, "r", ref, func(context.Context) (*payload.Value, error) { return tensor(x), nil })
	if err != nil {
		t.Fatal(err)
	}
	reader.Release("r")
	after := recordRev(t, url, ref)
	if path != coordinator.PathRemoteHit || !bytes.Equal(v.Tensor.Data, x) || after != before {
		t.Fatalf("a process of n1 that reaches the store: path %v, record rev %d -> %d, stats %+v; "+
			"want a remote hit of X and the record kept", path, before, after, reader.Stats())
	}
}

// recordRev is the revision of ref's record (0: none), read through a
// connection of its own.
func recordRev(t *testing.T, url string, ref coordinator.Ref) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := inspect.Bucket(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	_, rev, err := inspect.Record(ctx, b, ref.KVKey())
	if errors.Is(err, inspect.ErrNoRecord) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return rev
}
