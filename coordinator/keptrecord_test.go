package coordinator

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// A process whose payload is not shm (Mooncake; the memory transport
// here) has the node's shm store in its router too, which reads a value
// written on this node from that store first: a copy there, placed by the
// node's agent. A copy of another value of the key (an earlier one the
// agent served) is not the value's failure: the value's own transport is
// asked, and the intact record stays.
func TestAStaleNodeStoreCopyDoesNotPurgeTheRecord(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	node, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	mem := payload.NewMemoryStore("test-node", 0) // stands for Mooncake: not the node's store
	process := func() *Cache {
		t.Helper()
		c, err := New(ctx, connect(t, srv.ClientURL()), route(t, payload.TransportMemory, mem, payload.WithNodeStore(node)),
			WithLeaseTTL(time.Second), WithNode("test-node"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var cnt counter
	writer := process()
	if _, err := writer.GetOrCompute(ctx, "w", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")
	before := readRecord(t, writer, ref(1))
	if !before.Live || before.Record.State != lease.StateCommitted || before.Record.Location.Transport != payload.TransportMemory {
		t.Fatalf("the writer's record: %+v", before)
	}
	// The node's file of the key holds another value of it (of the same
	// size), as an agent of the node placed one it served earlier.
	if _, err := node.Put(ctx, ref(1).Object(), embedding(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Get(ctx, *before.Record.Location); err != nil {
		t.Fatalf("the committed payload itself: %v", err)
	}
	reader := process()
	v, path, err := reader.GetOrComputePath(ctx, "r", ref(1), cnt.fn(1))
	if err != nil {
		t.Fatal(err)
	}
	sameValue(t, v, 1)
	reader.Release("r")
	after := readRecord(t, reader, ref(1))
	if path != PathRemoteHit || cnt.n[1].Load() != 1 || after.Rev != before.Rev {
		t.Fatalf("a stale copy in the node's store: path %v, computed %d times (want a remote hit, once), "+
			"record rev %d -> %d (owner %q -> %q), reader's stats %+v",
			path, cnt.n[1].Load(), before.Rev, after.Rev, before.Record.Owner, recordOwner(after), reader.Stats())
	}
}

// recordOwner is e's owner, or "(none)" for no live record.
func recordOwner(e lease.Entry) string {
	if !e.Live {
		return "(none)"
	}
	return e.Record.Owner
}

// The compute that a kept record leads to (the pull failed with
// payload.ErrStoreUnreachable) is counted as
// degraded, in both modes, and is registered with the event link: an
// invalidation of its labels that arrives while it computes keeps its
// value out of the local cache, and one that arrives after drops the copy.
func TestAKeptRecordsUnsharedComputeFollowsInvalidations(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	ctx := context.Background()
	unreachable := fmt.Errorf("test: master down: %w (%w)", payload.ErrStoreUnreachable, payload.ErrUnavailable)
	writer := eventCache(t, srv.ClientURL(), store)
	for i, mode := range []Mode{ModeDegrade, ModeStrict} {
		r := ref(10 + i)
		r.Model = fmt.Sprint("m", i) // an invalidation of its own
		var cnt counter
		if _, err := writer.GetOrCompute(ctx, "w", r, cnt.fn(10+i)); err != nil {
			t.Fatal(err)
		}
		writer.Release("w")
		reader := eventCache(t, srv.ClientURL(), failingGets{store, unreachable}, WithMode(mode))
		waitFor(t, func() bool { return reader.Stats().Events })
		heard := reader.invalidationsHeard(r)
		started, release := make(chan struct{}), make(chan struct{})
		type answer struct {
			path Path
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			v, path, err := reader.GetOrComputePath(ctx, "r", r, func(context.Context) (*payload.Value, error) {
				close(started)
				<-release
				return embedding(10 + i), nil
			})
			if err == nil {
				sameValue(t, v, 10+i)
			}
			done <- answer{path, err}
		}()
		<-started
		if err := writer.Invalidate(ctx, r.Tenant, r.Model, r.Epoch); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return reader.invalidationsHeard(r) > heard })
		close(release)
		a := <-done
		if a.err != nil || a.path != PathDegraded {
			t.Fatalf("%v: %v %v, want its own compute, unshared", mode, a.path, a.err)
		}
		reader.Release("r")
		if s := reader.Stats(); s.Degraded != 1 || s.PayloadErrors != 1 {
			t.Fatalf("%v: stats %+v, want one degraded request and one payload error", mode, s)
		}
		if reader.local.Contains(r.local()) {
			t.Fatalf("%v: a value computed unshared while its labels were invalidated was kept", mode)
		}
	}
}

// A pull error's reason tells a store this process cannot reach (the
// record stays) from a node that cannot be reached (it is purged).
func TestPullReasonTellsAnUnreachableStoreApart(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("master down: %w (%w)", payload.ErrStoreUnreachable, payload.ErrUnavailable): pullUnreachable,
		fmt.Errorf("transfer failed: %w", payload.ErrUnavailable):                               pullUnavailable,
	} {
		if got := pullReason(err); got != want {
			t.Errorf("%v: reason %q, want %q", err, got, want)
		}
	}
}
