package coordinator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestR3LeaderLossDuringBurst stops the bucket's stream leader while three
// caches (one per node) reserve and commit a burst of keys: no key is
// committed twice, every caller gets the right value or a clear error, and
// sharing resumes after the election.
func TestR3LeaderLossDuringBurst(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := embedded.StartCluster(ctx, 3, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Shutdown()

	commits := &commitCounter{n: map[Ref]int{}}
	store := payload.NewMemoryStore("test-node", 0)
	caches := make([]*Cache, 3)
	for i, n := range cl.Nodes {
		// Each cache prefers its own node and fails over to the others.
		urls := n.ClientURL() + "," + strings.ReplaceAll(cl.ClientURLs(), n.ClientURL(), "")
		nc, err := nats.Connect(strings.Trim(strings.ReplaceAll(urls, ",,", ","), ","),
			nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.DontRandomize())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c, err := New(ctx, nc, WithReplicas(3), route(t, payload.TransportMemory, store),
			WithLeaseTTL(2*time.Second), WithOpTimeout(time.Second), WithNode("test-node"), WithObserver(commits))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		caches[i] = c
	}
	nc, _ := cl.Connect()
	defer nc.Close()
	js, _ := jetstream.New(nc)
	leader, err := cl.StreamLeader(ctx, js, "KV_"+lease.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}

	var cnt counter
	var served atomic.Int32
	stopLeader := make(chan struct{})
	const keys = 60
	var wg sync.WaitGroup
	var failures atomic.Int32
	for ci, c := range caches {
		for g := range 4 {
			wg.Go(func() {
				for k := range keys {
					if served.Add(1) == 60 {
						close(stopLeader) // a third of the way in
					}
					req := reqID(ci, g, k)
					v, err := c.GetOrCompute(ctx, req, ref(k), cnt.fn(k))
					if err != nil {
						failures.Add(1)
						t.Logf("caller %s: %v", req, err) // allowed: a clear error
						continue
					}
					sameValue(t, v, k)
					c.Release(req)
				}
			})
		}
	}
	<-stopLeader
	leader.Shutdown()
	wg.Wait()
	commits.mu.Lock()
	for r, n := range commits.n {
		if n > 1 {
			t.Errorf("%v committed %d times", r, n)
		}
	}
	t.Logf("leader %s stopped; %d commits, %d caller errors", leader.Name(), len(commits.n), failures.Load())
	commits.mu.Unlock()

	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitJetStream(ctx); err != nil {
		t.Fatal(err)
	}
	// Sharing resumes: a fresh key is computed once and pulled by the others.
	for attempt := 0; ; attempt++ {
		_, path, err := caches[0].GetOrComputePath(ctx, "after", ref(200+attempt), cnt.fn(200+attempt))
		if err == nil && path == PathComputed {
			_, path2, err := caches[1].GetOrComputePath(ctx, "after", ref(200+attempt), cnt.fn(200+attempt))
			if err != nil || path2 != PathRemoteHit {
				t.Fatalf("after the election: %v %v", path2, err)
			}
			break
		}
		if attempt > 20 {
			t.Fatalf("sharing did not resume: %v %v", path, err)
		}
	}
}

// commitCounter is an Observer that counts the commits of each key.
type commitCounter struct {
	mu sync.Mutex
	n  map[Ref]int
}

func (c *commitCounter) Reserved(Ref, uint64)       {}
func (c *commitCounter) Refused(Ref, uint64, error) {}
func (c *commitCounter) Committed(r Ref, _ uint64, _ payload.Checksum) {
	c.mu.Lock()
	c.n[r]++
	c.mu.Unlock()
}

// TestWaiterRacingTheCommit: on a 3-node cluster, a waiter on one server
// starts while the holder on another commits. However the commit falls
// between the waiter's first read, its subscription (whose interest
// reaches the leader's server over a route) and its second read, the
// waiter finds it from the change, the second read or an early poll, not
// a poll interval later: with the poll set to an hour, every wait ends
// well inside its 10 s deadline. (With hints on the key's own subject and
// before the early reads, about one wait in ten of these hit the poll.)
func TestWaiterRacingTheCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, _ := natstest.Cluster(ctx, t, 3)
	store := payload.NewMemoryStore("test-node", 0)
	join := func(i int, opts ...Option) *Cache {
		t.Helper()
		nc := connect(t, cl.Nodes[i].ClientURL())
		base := []Option{route(t, payload.TransportMemory, store), WithNode("test-node"), WithReplicas(3), WithMode(ModeStrict)}
		var c *Cache
		var err error
		waitFor(t, func() bool { // the cluster's first bucket needs a meta leader
			c, err = New(ctx, nc, append(base, opts...)...)
			return err == nil
		})
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := join(0)
	waiter := join(1, WithPollInterval(time.Hour))
	// A bucket just made may not have elected its stream's leader yet: a
	// write then has no responder ("no response from stream").
	waitFor(t, func() bool {
		r, err := holder.Reserve(ctx, ref(1000))
		if err != nil {
			return false
		}
		r.Abandon(ctx, errors.New("ready"))
		return true
	})
	var cnt counter
	for i := range 200 {
		r, err := holder.Reserve(ctx, ref(i))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := waiter.GetOrCompute(wctx, "w", ref(i), cnt.fn(i))
			done <- err
		}()
		// The commit lands anywhere from before the waiter's first read to
		// well into its wait.
		sleepCtx(ctx, time.Duration(i%20)*100*time.Microsecond)
		if _, err := r.Commit(ctx, embedding(i)); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		waiter.Release("w")
	}
	if s := waiter.Stats(); s.Computes != 0 {
		t.Fatalf("the waiter computed: %+v", s)
	}
}
