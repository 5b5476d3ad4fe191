package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// offsetClock runs at real speed, ahead of the server by d.
type offsetClock time.Duration

func (o offsetClock) Now() time.Time { return time.Now().Add(time.Duration(o)) }

// recorder is an Observer that keeps what it heard.
type recorder struct {
	mu                 sync.Mutex
	committed, refused []uint64
	reserved           []uint64
}

func (r *recorder) Reserved(_ Ref, rev uint64) {
	r.mu.Lock()
	r.reserved = append(r.reserved, rev)
	r.mu.Unlock()
}
func (r *recorder) Committed(_ Ref, rev uint64, _ payload.Checksum) {
	r.mu.Lock()
	r.committed = append(r.committed, rev)
	r.mu.Unlock()
}
func (r *recorder) Refused(_ Ref, rev uint64, _ error) {
	r.mu.Lock()
	r.refused = append(r.refused, rev)
	r.mu.Unlock()
}

// The lease TTL is long (the server never expires the record during a
// test); only the client's clock moves past deadlines.
const longLease = 30 * time.Second

// leaseTest is a Cache whose lease deadlines run on a manual clock and
// whose lease store calls' answers pass through hooks (one call each).
type leaseTest struct {
	c     *Cache
	clock *fakeclock.Clock
	obs   *recorder
	mu    sync.Mutex
	hooks map[string]func(error) error // by op: "write", "read"
}

func newLeaseTest(t *testing.T, opts ...Option) *leaseTest {
	t.Helper()
	srv := startServer(t)
	lt := &leaseTest{clock: fakeclock.New(time.Now()), obs: &recorder{}, hooks: map[string]func(error) error{}}
	answered := func(s *settings) error {
		s.leaseStore = func(st lease.Store) lease.Store { return answeredStore{st, lt} }
		return nil
	}
	lt.c = newCache(t, srv.ClientURL(), payload.NewMemoryStore("test-node", 0),
		append([]Option{WithLeaseTTL(longLease), WithClock(lt.clock), WithObserver(lt.obs), answered}, opts...)...)
	return lt
}

// answeredStore passes the answers of a lease's writes ("write") and reads
// ("read") through the test's hooks.
type answeredStore struct {
	lease.Store
	lt *leaseTest
}

func (a answeredStore) CompareAndSet(ctx context.Context, key string, rev uint64, r lease.Record, ttl time.Duration) (uint64, error) {
	newRev, err := a.Store.CompareAndSet(ctx, key, rev, r, ttl)
	return newRev, a.lt.answer("write", err)
}

func (a answeredStore) Read(ctx context.Context, key string) (lease.Entry, error) {
	cur, err := a.Store.Read(ctx, key)
	return cur, a.lt.answer("read", err)
}

// answer passes err through the hook of op, once.
func (lt *leaseTest) answer(op string, err error) error {
	lt.mu.Lock()
	h := lt.hooks[op]
	delete(lt.hooks, op)
	lt.mu.Unlock()
	if h != nil {
		return h(err)
	}
	return err
}

// onNext makes the answer of the lease's next op ("write" or "read") go
// through h.
func (lt *leaseTest) onNext(op string, h func(error) error) {
	lt.mu.Lock()
	lt.hooks[op] = h
	lt.mu.Unlock()
}

func (lt *leaseTest) read(t *testing.T, key string) lease.Entry {
	t.Helper()
	ls := lt.c.bucket()
	cur, err := ls.Read(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// A commit on a revision whose TTL has lapsed by the client's clock is
// refused without being sent, although the server still holds the record.
func TestCommitPastDeadlineIsRefused(t *testing.T) {
	lt := newLeaseTest(t)
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(1))
	if err != nil {
		t.Fatal(err)
	}
	rev := res.Revision()
	lt.clock.Advance(longLease)
	if _, err := res.Commit(ctx, embedding(1)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("commit past the deadline: %v, want ErrLeaseLost", err)
	}
	cur := lt.read(t, ref(1).KVKey())
	if !cur.Live || cur.Rev != rev || cur.Record.State != lease.StateComputing {
		t.Fatalf("server state %+v, want the computing record at %d", cur, rev)
	}
	if s := lt.c.Stats(); s.CommitsRefused != 1 || len(lt.obs.committed) != 0 || len(lt.obs.refused) != 1 {
		t.Fatalf("refused %d, observed committed %v refused %v", s.CommitsRefused, lt.obs.committed, lt.obs.refused)
	}
	if res.Err() == nil {
		t.Fatal("lease not lost")
	}
}

// A commit the server accepts but acknowledges at or after the deadline is
// not claimed: the server's TTL marker may wipe it.
func TestLateCommitAckIsNotTrusted(t *testing.T) {
	lt := newLeaseTest(t)
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(2))
	if err != nil {
		t.Fatal(err)
	}
	lt.onNext("write", func(err error) error { lt.clock.Advance(longLease); return err }) // a slow answer
	if _, err := res.Commit(ctx, embedding(2)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("late commit: %v, want ErrLeaseLost", err)
	}
	if cur := lt.read(t, ref(2).KVKey()); !cur.Live || cur.Record.State != lease.StateCommitted {
		t.Fatalf("the server should hold the (untrusted) commit: %+v", cur)
	}
	s := lt.c.Stats()
	if s.LateWrites != 1 || s.CommitsRefused != 1 || len(lt.obs.committed) != 0 {
		t.Fatalf("late %d refused %d committed %v", s.LateWrites, s.CommitsRefused, lt.obs.committed)
	}
}

// A commit whose answer was lost but which landed is found by reading the
// key back, and claimed once: no second write.
func TestCommitWithLostAckIsSettled(t *testing.T) {
	lt := newLeaseTest(t)
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(5))
	if err != nil {
		t.Fatal(err)
	}
	lt.onNext("write", func(err error) error {
		if err != nil {
			t.Errorf("the write itself failed: %v", err)
		}
		return context.DeadlineExceeded // it landed; its answer did not come back
	})
	if _, err := res.Commit(ctx, embedding(5)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	cur := lt.read(t, ref(5).KVKey())
	if !cur.Live || cur.Record.State != lease.StateCommitted || cur.Rev != res.Revision() {
		t.Fatalf("server %+v, res at %d", cur, res.Revision())
	}
	if len(lt.obs.committed) != 1 || lt.obs.committed[0] != cur.Rev {
		t.Fatalf("observed commits %v, want [%d]", lt.obs.committed, cur.Rev)
	}
	if s := streamState(t, lt.c); s.LastSeq != cur.Rev {
		t.Fatalf("stream last sequence %d: a second write after the commit at %d", s.LastSeq, cur.Rev)
	}
}

// The read-back that proves a lost answer's write landed counts only if
// it comes before the deadline.
func TestLostAckProvenTooLateIsRefused(t *testing.T) {
	lt := newLeaseTest(t)
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(6))
	if err != nil {
		t.Fatal(err)
	}
	lt.onNext("write", func(error) error { return context.DeadlineExceeded })            // landed; no answer
	lt.onNext("read", func(err error) error { lt.clock.Advance(longLease); return err }) // a slow read-back
	if _, err := res.Commit(ctx, embedding(6)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("commit proven late: %v, want ErrLeaseLost", err)
	}
	if len(lt.obs.committed) != 0 {
		t.Fatalf("claimed %v", lt.obs.committed)
	}
}

func streamState(t *testing.T, c *Cache) jetstream.StreamState {
	t.Helper()
	s, err := c.js.Stream(context.Background(), "KV_"+c.s.bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State
}

// A computing record nobody renews (written by hand, without a TTL) is
// purged on its revision and taken over once it is two lease TTLs old.
func TestStaleComputingRecordIsTakenOver(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	fresh := newCache(t, srv.ClientURL(), store)
	putRecord(t, fresh, ref(7).KVKey(), []byte(`{"v":1,"state":"computing","owner":"ghost/1/x","nonce":"n",`+
		`"started":"2020-01-01T00:00:00Z","heartbeat":"2020-01-01T00:00:00Z"}`))
	// Written just now by the server's clock: not stale yet.
	if _, err := fresh.Reserve(context.Background(), ref(7)); !errors.Is(err, ErrHeld) {
		t.Fatalf("fresh foreign record: %v, want ErrHeld", err)
	}
	// Three res TTLs later (by this process's clock), it is.
	later := newCache(t, srv.ClientURL(), store, WithClock(offsetClock(3*time.Second)))
	var cnt counter
	v, path, err := later.GetOrComputePath(context.Background(), "r", ref(7), cnt.fn(7))
	if err != nil || path != PathComputed {
		t.Fatalf("takeover: %v %v", path, err)
	}
	sameValue(t, v, 7)
	if later.Stats().StaleTakeovers != 1 {
		t.Fatalf("stale takeovers %d", later.Stats().StaleTakeovers)
	}
	if _, path, err := fresh.GetOrComputePath(context.Background(), "f", ref(7), cnt.fn(7)); err != nil || path != PathRemoteHit {
		t.Fatalf("shared again: %v %v", path, err)
	}
}

// A record that does not decode is purged once older than a lease TTL, so
// its key is shared again; a younger one is computed around.
func TestUnreadableRecordIsPurged(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	fresh := newCache(t, srv.ClientURL(), store)
	putRecord(t, fresh, ref(8).KVKey(), []byte("not a record"))
	var cnt counter
	if _, path, err := fresh.GetOrComputePath(context.Background(), "f", ref(8), cnt.fn(8)); err != nil || path != PathDegraded {
		t.Fatalf("young unreadable record: %v %v, want degraded", path, err)
	}
	later := newCache(t, srv.ClientURL(), store, WithClock(offsetClock(2*time.Second)))
	if _, path, err := later.GetOrComputePath(context.Background(), "l", ref(8), cnt.fn(8)); err != nil || path != PathComputed {
		t.Fatalf("old unreadable record: %v %v, want computed", path, err)
	}
	if s := later.Stats(); s.BadRecordsPurged != 1 || s.BadRecords != 1 {
		t.Fatalf("purged %d bad %d", s.BadRecordsPurged, s.BadRecords)
	}
	other := newCache(t, srv.ClientURL(), store)
	if _, path, err := other.GetOrComputePath(context.Background(), "o", ref(8), cnt.fn(8)); err != nil || path != PathRemoteHit {
		t.Fatalf("shared again: %v %v", path, err)
	}
}

// A tombstone at a value's key, a state such a key does not hold, is a
// bad record like one that does not decode: counted and computed around
// while young, purged once older than a lease TTL. (It was taken for a
// compute elsewhere: every GetOrCompute of the key waited until its own
// deadline, for as long as the record lived.)
func TestATombstoneAtAValuesKeyIsABadRecord(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	fresh := newCache(t, srv.ClientURL(), store)
	putRecord(t, fresh, ref(9).KVKey(), []byte(`{"v":1,"state":"invalidated","owner":"cli/1/x",`+
		`"started":"2020-01-01T00:00:00Z","heartbeat":"2020-01-01T00:00:00Z","model":"m","epoch":1}`))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var cnt counter
	if _, path, err := fresh.GetOrComputePath(ctx, "f", ref(9), cnt.fn(9)); err != nil || path != PathDegraded {
		t.Fatalf("young tombstone at a value's key: %v %v, want degraded", path, err)
	}
	if s := fresh.Stats(); s.BadRecords != 1 || s.BadRecordsPurged != 0 {
		t.Fatalf("young: bad %d purged %d", s.BadRecords, s.BadRecordsPurged)
	}
	later := newCache(t, srv.ClientURL(), store, WithClock(offsetClock(2*time.Second)))
	if _, path, err := later.GetOrComputePath(ctx, "l", ref(9), cnt.fn(9)); err != nil || path != PathComputed {
		t.Fatalf("old tombstone at a value's key: %v %v, want computed", path, err)
	}
	if s := later.Stats(); s.BadRecordsPurged != 1 || s.BadRecords != 1 {
		t.Fatalf("old: purged %d bad %d", s.BadRecordsPurged, s.BadRecords)
	}
	other := newCache(t, srv.ClientURL(), store)
	if _, path, err := other.GetOrComputePath(ctx, "o", ref(9), cnt.fn(9)); err != nil || path != PathRemoteHit {
		t.Fatalf("shared again: %v %v", path, err)
	}
}

// putRecord writes b under key as a foreign process would: no TTL.
func putRecord(t *testing.T, c *Cache, key string, b []byte) {
	t.Helper()
	ls := c.bucket()
	if _, err := ls.KV(key).Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

// A direct get (tenant mode) may be a follower's answer: it never proves
// that a write whose answer was lost landed.
func TestLostAckNotProvenByDirectRead(t *testing.T) {
	lt := newLeaseTest(t, WithTenants("acme"))
	ctx := context.Background()
	res, err := lt.c.Reserve(ctx, ref(10))
	if err != nil {
		t.Fatal(err)
	}
	lt.onNext("write", func(error) error { return context.DeadlineExceeded })
	if _, err := res.Commit(ctx, embedding(10)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("commit proven by a direct read: %v, want ErrLeaseLost", err)
	}
	if len(lt.obs.committed) != 0 {
		t.Fatalf("claimed %v", lt.obs.committed)
	}
}

// holderAndWaiter starts a server and two caches on it sharing one memory
// store: a holder, and a waiter whose poll (an hour) never ends a test's
// wait, so that only what it hears wakes it.
func holderAndWaiter(t *testing.T) (srv *embedded.Server, holder, waiter *Cache) {
	srv = startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	return srv, newCache(t, srv.ClientURL(), store), newCache(t, srv.ClientURL(), store, WithPollInterval(time.Hour))
}

// TestWaiterWakesOnTheCommit: a waiter is woken by the commit the stream
// republishes, not by its poll (set far beyond the wait's deadline here),
// however the commit races its subscription and reads. 100 rounds.
func TestWaiterWakesOnTheCommit(t *testing.T) {
	_, holder, waiter := holderAndWaiter(t)
	ctx := context.Background()
	var cnt counter
	for i := range 100 {
		r, err := holder.Reserve(ctx, ref(i))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			v, path, err := waiter.GetOrComputePath(wctx, "w", ref(i), cnt.fn(i))
			if err == nil && path != PathWaited {
				err = fmt.Errorf("path %v", path)
			}
			if err == nil {
				sameValue(t, v, i)
			}
			done <- err
		}()
		waitFor(t, func() bool { return waiter.Stats().Waits == uint64(i+1) })
		if _, err := r.Commit(ctx, embedding(i)); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		waiter.Release("w")
	}
	if n := cnt.n[0].Load(); n != 0 {
		t.Fatalf("the waiter computed")
	}
}

// TestWaiterIgnoresAnOlderChange: a change no newer than the waiter's own
// read (as a new stream leader republishes its predecessor's entries) is
// not taken. Here it is another key's committed record, republished late
// under this key: taken, it would serve the other key's value.
func TestWaiterIgnoresAnOlderChange(t *testing.T) {
	srv, holder, waiter := holderAndWaiter(t)
	ctx := context.Background()
	var cnt counter
	if _, err := holder.GetOrCompute(ctx, "h", ref(1), cnt.fn(1)); err != nil {
		t.Fatal(err)
	}
	holder.Release("h")
	b := holder.bucket()
	other, err := b.KV(ref(1).KVKey()).Get(ctx, ref(1).KVKey())
	if err != nil {
		t.Fatal(err)
	}
	r, err := holder.Reserve(ctx, ref(0))
	if err != nil {
		t.Fatal(err)
	}
	if r.Revision() <= other.Revision() {
		t.Fatalf("reserved at %d, after the other key's %d", r.Revision(), other.Revision())
	}
	subject := b.StoredSubject(ref(0).KVKey())
	type got struct {
		v    *payload.Value
		path Path
		err  error
	}
	done := make(chan got, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, path, err := waiter.GetOrComputePath(wctx, "w", ref(0), cnt.fn(0))
		done <- got{v, path, err}
	}()
	// The waiter has subscribed: the server has interest in the subject.
	waitFor(t, func() bool { return srv.NATS().GlobalAccount().Interest(subject) > 0 })
	late := nats.NewMsg(subject)
	late.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(other.Revision(), 10))
	late.Header.Set(jetstream.TimeStampHeaer, other.Created().UTC().Format(time.RFC3339Nano))
	late.Data = other.Value()
	if err := holder.nc.PublishMsg(late); err != nil {
		t.Fatal(err)
	}
	if err := holder.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Commit(ctx, embedding(0)); err != nil {
		t.Fatal(err)
	}
	g := <-done
	if g.err != nil || g.path != PathWaited {
		t.Fatalf("the waiter: %v %v", g.path, g.err)
	}
	sameValue(t, g.v, 0)
	if s := waiter.Stats(); s.PayloadErrors != 0 || s.Computes != 0 {
		t.Fatalf("the waiter took the older change: %+v", s)
	}
}

// A reader whose clock runs well ahead of the servers' (30 s, six lease
// TTLs) waits on a live lease: a record with a TTL of its own is the
// server's to expire, whatever age the reader's clock gives it. (A
// reader about 8 s ahead, at the default lease, took over every live
// lease it waited on, so keys were computed twice with no fault.)
func TestASkewedReaderNeverTakesOverALiveLease(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	holder := newCache(t, srv.ClientURL(), store)
	skewed := newCache(t, srv.ClientURL(), store, WithClock(offsetClock(30*time.Second)))
	started, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := holder.GetOrCompute(context.Background(), "h", ref(10), func(context.Context) (*payload.Value, error) {
			close(started)
			<-release
			return embedding(10), nil
		})
		held <- err
	}()
	<-started
	var cnt counter
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond) // over two renewals of the 1 s lease
	_, path, err := skewed.GetOrComputePath(ctx, "s", ref(10), cnt.fn(10))
	cancel()
	if cnt.n[10].Load() != 0 || skewed.Stats().StaleTakeovers != 0 {
		t.Fatalf("the skewed reader took the live lease over (%v, %v; %d computes, %d takeovers)",
			path, err, cnt.n[10].Load(), skewed.Stats().StaleTakeovers)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	if s := holder.Stats(); s.Computes != 1 || s.CommitsRefused != 0 || s.LeasesLost != 0 {
		t.Fatalf("holder %+v", s)
	}
}
