package coordinator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// The removal of uncommitted payloads around its edges: a commit in
// flight, Close, a delete that finds other bytes, a payload queued twice
// (coordinator/uncommitted.go, docs/protocol.md 2.5).

// pollUntil waits for cond, failing the test after 20 s.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 20 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inflightCommit is a lease store whose commit (the CAS of a committed
// record) is sent, but whose caller stops waiting for its answer before
// the server has applied it: the CAS lands only once the test releases it.
// It is what a caller's ctx that ends during a commit does on a cluster
// (the publish is on its way, in the stream's raft log, or queued on the
// leader): the write is not withdrawn.
type inflightCommit struct {
	lease.Store
	st *inflightState
}

type inflightState struct {
	cancel  context.CancelFunc // the commit caller's
	release chan struct{}      // closed: the CAS is applied
	landed  chan error         // the CAS's result, once applied
}

func (s inflightCommit) CompareAndSet(ctx context.Context, key string, rev uint64, r lease.Record, ttl time.Duration) (uint64, error) {
	if r.State != lease.StateCommitted {
		return s.Store.CompareAndSet(ctx, key, rev, r, ttl)
	}
	go func() {
		<-s.st.release
		_, err := s.Store.CompareAndSet(context.Background(), key, rev, r, ttl)
		s.st.landed <- err
	}()
	s.st.cancel() // the caller gives up on the answer
	<-ctx.Done()
	return 0, ctx.Err()
}

// A commit whose caller's context ends while its CAS is in flight returns
// an error, and its payload is queued; the CAS lands later, and the lease
// adopts it. The removal, which reads the writer's own computing record
// meanwhile, waits: the write of unknown outcome may yet name the bytes,
// and no generation moves to protect them (no Put happened).
func TestAnInFlightCommitsPayloadIsNotRemoved(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	st := &inflightState{release: make(chan struct{}), landed: make(chan error, 1)}
	hook := func(s *settings) error {
		s.leaseStore = func(ls lease.Store) lease.Store { return inflightCommit{ls, st} }
		return nil
	}
	var fail atomic.Bool
	var tried atomic.Int32
	c := newCache(t, srv.ClientURL(), failingGeneration{store, &fail, &tried}, WithLeaseTTL(longLease), hook)
	res, err := c.Reserve(context.Background(), ref(1))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st.cancel = cancel
	if _, err := res.Commit(cctx, embedding(1)); err == nil {
		t.Fatal("the commit whose answer its caller gave up on succeeded")
	}
	// The removal tries now, while the CAS is still in flight.
	pollUntil(t, "the removal's first try", func() bool { return tried.Load() > 0 })
	close(st.release)
	if err := <-st.landed; err != nil {
		t.Fatalf("the in-flight commit did not land: %v", err)
	}
	settleUncommitted(t, c)
	cur, err := c.bucket().Read(context.Background(), ref(1).KVKey())
	if err != nil || !cur.Live || cur.Record.State != lease.StateCommitted {
		t.Fatalf("the key's record: %+v %v, want the commit that landed", cur, err)
	}
	if v, err := store.Get(context.Background(), *cur.Record.Location); err != nil {
		t.Fatalf("a live committed record (rev %d) names a payload the uncommitted removal deleted: %v (UncommittedDeleted %d)",
			cur.Rev, err, c.Stats().UncommittedDeleted)
	} else {
		v.Close()
	}
}

// blockCommit is a lease store whose commit CAS waits until its context
// ends (Close cancels it): a commit cut short by Close.
type blockCommit struct {
	lease.Store
	entered chan struct{}
}

func (s blockCommit) CompareAndSet(ctx context.Context, key string, rev uint64, r lease.Record, ttl time.Duration) (uint64, error) {
	if r.State != lease.StateCommitted {
		return s.Store.CompareAndSet(ctx, key, rev, r, ttl)
	}
	close(s.entered)
	<-ctx.Done()
	return 0, ctx.Err()
}

// A commit cut short by Close queues its payload after Close has ended
// the Cache's life: it is counted and logged as left (docs/protocol.md
// 2.5), not forgotten.
func TestACommitCutShortByCloseIsCountedLeft(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	entered := make(chan struct{})
	hook := func(s *settings) error {
		s.leaseStore = func(ls lease.Store) lease.Store { return blockCommit{ls, entered} }
		return nil
	}
	c := newCache(t, srv.ClientURL(), store, WithLeaseTTL(longLease), hook)
	res, err := c.Reserve(context.Background(), ref(2))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := res.Commit(context.Background(), embedding(2))
		done <- err
	}()
	<-entered
	c.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("the commit Close cut short: %v, want ErrClosed", err)
	}
	s := c.Stats()
	if store.Bytes() != 0 && s.UncommittedLeft == 0 {
		t.Fatalf("after Close: %d bytes of a commit cut short by Close are left in the store, "+
			"uncommitted deleted %d, left %d, still queued %d: neither removed nor counted nor logged",
			store.Bytes(), s.UncommittedDeleted, s.UncommittedLeft, c.uncommitted.len())
	}
}

// failingGeneration is a transport whose Generation fails (the store is
// unreachable) while fail is set.
type failingGeneration struct {
	*payload.MemoryStore
	fail  *atomic.Bool
	tried *atomic.Int32
}

func (f failingGeneration) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	f.tried.Add(1)
	if f.fail.Load() {
		return payload.Generation{}, errors.New("store unreachable")
	}
	return f.MemoryStore.Generation(ctx, loc)
}

// A payload waiting when Close begins is counted (Stats.UncommittedLeft)
// and logged.
func TestAPayloadWaitingAtCloseIsCountedLeft(t *testing.T) {
	srv := startServer(t)
	mem := payload.NewMemoryStore("test-node", 0)
	var fail atomic.Bool
	var tried atomic.Int32
	fail.Store(true)
	c := newCache(t, srv.ClientURL(), failingGeneration{mem, &fail, &tried}, WithLeaseTTL(longLease))
	ctx := context.Background()
	loc, err := mem.Put(ctx, ref(3).Object(), embedding(3))
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Reserve(ctx, ref(3))
	if err != nil {
		t.Fatal(err)
	}
	res.putUncommitted(loc) // as a commit that did not land does
	pollUntil(t, "the removal's first try", func() bool { return tried.Load() > 0 })
	c.Close()
	if s := c.Stats(); s.UncommittedLeft != 1 {
		t.Fatalf("a payload waiting when Close began: uncommitted left %d (removed %d, still queued %d), want 1 (docs/protocol.md 2.5)",
			s.UncommittedLeft, s.UncommittedDeleted, c.uncommitted.len())
	}
}

// otherBytesBeforeDelete is a transport where, between the removal's
// read of the record and its Delete, the key's value is put again with
// other bytes (the key recomputed after an invalidation, on this node).
type otherBytesBeforeDelete struct {
	*payload.MemoryStore
	obj   payload.ObjectID
	other *payload.Value
	once  *sync.Once
}

func (o otherBytesBeforeDelete) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	o.once.Do(func() {
		if _, err := o.MemoryStore.Put(ctx, o.obj, o.other); err != nil {
			panic(err)
		}
	})
	return o.MemoryStore.Delete(ctx, loc, seen)
}

// A payload whose key's value is put again with other bytes between the
// removal's read of the record and its Delete keeps the other bytes: the
// delete is conditional on the bytes.
func TestADeleteLeavesOtherBytesPutInThePayloadsPlace(t *testing.T) {
	srv := startServer(t)
	mem := payload.NewMemoryStore("test-node", 0)
	tr := otherBytesBeforeDelete{mem, ref(4).Object(), embedding(40), &sync.Once{}}
	c := newCache(t, srv.ClientURL(), tr, WithLeaseTTL(longLease))
	ctx := context.Background()
	res, err := c.Reserve(ctx, ref(4))
	if err != nil {
		t.Fatal(err)
	}
	loc, err := mem.Put(ctx, ref(4).Object(), embedding(4))
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Abandon(ctx, errors.New("test")); err != nil {
		t.Fatal(err)
	}
	res.putUncommitted(loc) // as a commit that did not land does
	settleUncommitted(t, c)
	other, err := payload.Encode(embedding(40))
	if err != nil {
		t.Fatal(err)
	}
	if mem.Bytes() != int64(len(other)) {
		t.Errorf("the other bytes put in the payload's place: %d bytes left, want %d", mem.Bytes(), len(other))
	}
}

// gatedGeneration blocks the removal's first Generation until released,
// and fails it.
type gatedGeneration struct {
	*payload.MemoryStore
	entered chan struct{}
	release chan struct{}
	first   *atomic.Bool
}

func (g gatedGeneration) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	if g.first.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
		return payload.Generation{}, errors.New("store unreachable")
	}
	return g.MemoryStore.Generation(ctx, loc)
}

// A payload given up after its patience, while the same object was
// queued again (a second commit of the key by this process, refused too),
// is not counted as left: the new entry is the payload's, and is removed.
func TestAReQueuedPayloadIsNotCountedLeft(t *testing.T) {
	srv := startServer(t)
	mem := payload.NewMemoryStore("test-node", 0)
	first := &atomic.Bool{}
	first.Store(true)
	gg := gatedGeneration{mem, make(chan struct{}), make(chan struct{}), first}
	c := newCache(t, srv.ClientURL(), gg, WithLeaseTTL(longLease))
	ctx := context.Background()
	loc, err := mem.Put(ctx, ref(5).Object(), embedding(5))
	if err != nil {
		t.Fatal(err)
	}
	old := uncommitted{ref: ref(5), loc: loc, since: time.Now().Add(-2 * uncommittedPatience)}
	c.uncommitted.add(old)
	<-gg.entered
	// The key's second commit attempt by this process, refused too.
	c.uncommitted.add(uncommitted{ref: ref(5), loc: loc, since: time.Now()})
	close(gg.release)
	settleUncommitted(t, c)
	if s := c.Stats(); s.UncommittedLeft != 0 || s.UncommittedDeleted != 1 {
		t.Fatalf("one payload, queued twice and removed: uncommitted left %d, removed %d; want 0, 1", s.UncommittedLeft, s.UncommittedDeleted)
	}
}

// Where the bucket's reads are direct gets (tenant mode), a lagging
// follower may show no record where the leader holds one: a payload is
// not deleted before it has waited uncommittedDirectWait.
func TestADirectReadersUncommittedPayloadWaits(t *testing.T) {
	srv := startServer(t)
	mem := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, srv.ClientURL(), mem, WithTenants(ref(6).Tenant))
	ctx := context.Background()
	loc, err := mem.Put(ctx, ref(6).Object(), embedding(6))
	if err != nil {
		t.Fatal(err)
	}
	fresh := uncommitted{ref: ref(6), loc: loc, since: time.Now()}
	if c.removeUncommitted(ctx, fresh) || mem.Bytes() == 0 {
		t.Fatal("a payload was deleted before the direct readers' wait")
	}
	waited := uncommitted{ref: ref(6), loc: loc, since: time.Now().Add(-uncommittedDirectWait)}
	if !c.removeUncommitted(ctx, waited) || mem.Bytes() != 0 {
		t.Fatalf("a payload with no record, after the wait: %d bytes left", mem.Bytes())
	}
}
