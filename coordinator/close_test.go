package coordinator

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// heldGets is a payload transport whose first Get, once started, waits
// for its ctx to end or for release before it reads.
type heldGets struct {
	payload.Transport
	once    sync.Once
	started chan struct{} // closed when the first Get starts
	ended   chan struct{} // closed when it returns
	release chan struct{}
}

func newHeldGets(t payload.Transport) *heldGets {
	return &heldGets{Transport: t, started: make(chan struct{}), ended: make(chan struct{}), release: make(chan struct{})}
}

func (h *heldGets) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	first := false
	h.once.Do(func() { first = true })
	if !first {
		return h.Transport.Get(ctx, loc)
	}
	close(h.started)
	defer close(h.ended)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-h.release:
		return h.Transport.Get(ctx, loc)
	}
}

// recordOf reads r's record from the stream leader, through a connection
// and a bucket of the test's own.
func recordOf(t *testing.T, url string, r Ref) lease.Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := lease.BindBucket(ctx, connect(t, url), lease.BucketConfig{Name: lease.DefaultBucket})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e, err := b.Read(ctx, r.KVKey())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type result struct {
	v    *payload.Value
	path Path
	err  error
}

// within waits at most 10 s for a request's result.
func within(t *testing.T, got <-chan result) result {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not return in 10s")
		return result{}
	}
}

// TestCloseCancelsARemoteHitInFlight: a pull in flight when Close is
// called (GetOrCompute's, and Get's, which has a flight of its own) is
// cancelled, its caller gets ErrClosed, and Close returns only once the
// pull has ended. The committed record stays as it was: a pull cut short
// is no corrupt payload.
func TestCloseCancelsARemoteHitInFlight(t *testing.T) {
	for _, call := range []struct {
		name string
		get  func(c *Cache) (*payload.Value, Path, error)
	}{
		{"GetOrCompute", func(c *Cache) (*payload.Value, Path, error) {
			return c.GetOrComputePath(context.Background(), "r", ref(1), noCompute(t))
		}},
		{"Get", func(c *Cache) (*payload.Value, Path, error) { return c.Get(context.Background(), "r", ref(1)) }},
	} {
		t.Run(call.name, func(t *testing.T) {
			ctx := context.Background()
			url := startServer(t).ClientURL()
			store := payload.NewMemoryStore("test-node", 0)
			writer := newCache(t, url, store)
			var n counter
			if _, err := writer.GetOrCompute(ctx, "w", ref(1), n.fn(1)); err != nil {
				t.Fatal(err)
			}
			before := recordOf(t, url, ref(1))
			held := newHeldGets(store)
			release := sync.OnceFunc(func() { close(held.release) })
			defer release()
			reader := newCache(t, url, store, route(t, payload.TransportMemory, held))
			got := make(chan result, 1)
			go func() {
				v, path, err := call.get(reader)
				got <- result{v, path, err}
			}()
			<-held.started
			reader.Close()
			select {
			case <-held.ended:
			default:
				t.Error("Close returned while the pull was in flight")
			}
			release() // a pull still in flight (it should not be) ends now
			if r := within(t, got); !errors.Is(r.err, ErrClosed) {
				t.Errorf("the request in flight got %v %v, want ErrClosed", r.path, r.err)
			}
			after := recordOf(t, url, ref(1))
			if !after.Live || after.Rev != before.Rev || after.Record.State != lease.StateCommitted {
				t.Errorf("the record changed: %+v, was %+v", after, before)
			}
			if s := reader.Stats(); s.RemoteHits != 0 || s.Computes != 0 {
				t.Errorf("the closed cache served or computed: %+v", s)
			}
		})
	}
}

// TestCloseCancelsAWaitForAnotherProcess: a request waiting for another
// process's compute when Close is called returns ErrClosed, and its wait
// (its subscription to the key's changes) has ended when Close returns;
// the commit that follows reaches nobody in the closed Cache.
func TestCloseCancelsAWaitForAnotherProcess(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store := payload.NewMemoryStore("test-node", 0)
	holder := newCache(t, url, store)
	res, err := holder.Reserve(ctx, ref(2))
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, url)
	waiter, err := New(ctx, nc, route(t, payload.TransportMemory, store), WithLeaseTTL(time.Second),
		WithNode("test-node"), WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	subs := nc.NumSubscriptions()
	var n counter
	got := make(chan result, 1)
	go func() {
		v, path, err := waiter.GetOrComputePath(ctx, "w", ref(2), n.fn(2))
		got <- result{v, path, err}
	}()
	waitFor(t, func() bool { return waiter.Stats().Waits == 1 && nc.NumSubscriptions() == subs+1 })
	waiter.Close()
	if now := nc.NumSubscriptions(); now != subs {
		t.Errorf("Close returned while the wait was in flight (%d subscriptions, %d before it)", now, subs)
	}
	if _, err := res.Commit(ctx, embedding(2)); err != nil {
		t.Fatal(err)
	}
	if r := within(t, got); !errors.Is(r.err, ErrClosed) {
		t.Errorf("the waiting request got %v %v, want ErrClosed", r.path, r.err)
	}
	if s := waiter.Stats(); s.RemoteHits != 0 || s.Computes != 0 || n.n[2].Load() != 0 {
		t.Errorf("the closed cache pulled or computed: %+v", s)
	}
}

// TestCloseAbandonsACancelledCompute: a compute in flight when Close is
// called sees its ctx end; Close returns once it has, and its key has been
// abandoned, so another process reserves it at once (not a lease TTL
// later).
func TestCloseAbandonsACancelledCompute(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store := payload.NewMemoryStore("test-node", 0)
	other := newCache(t, url, store, WithLeaseTTL(30*time.Second))
	c := newCache(t, url, store, WithLeaseTTL(30*time.Second))
	started, ended, releasec := make(chan struct{}), make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(releasec) })
	defer release()
	fn := func(ctx context.Context) (*payload.Value, error) {
		close(started)
		defer close(ended)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-releasec:
			return embedding(3), nil
		}
	}
	got := make(chan result, 1)
	go func() {
		v, path, err := c.GetOrComputePath(ctx, "r", ref(3), fn)
		got <- result{v, path, err}
	}()
	<-started
	c.Close()
	select {
	case <-ended:
	default:
		t.Error("Close returned while the compute was in flight")
	}
	release() // a compute still in flight (it should not be) ends now
	if e := recordOf(t, url, ref(3)); e.Live {
		t.Errorf("the cancelled compute's key is still held: %+v", e.Record)
	}
	r, err := other.Reserve(ctx, ref(3))
	if err != nil {
		t.Errorf("another process could not reserve the key: %v", err)
	} else {
		r.Abandon(ctx, errors.New("test done"))
	}
	if r := within(t, got); !errors.Is(r.err, ErrClosed) {
		t.Errorf("the computing request got %v %v, want ErrClosed", r.path, r.err)
	}
}

// TestCloseGivesUpOnAComputeThatIgnoresItsContext: Close waits a lease
// TTL at most for a compute that ignores its ctx, then returns; the
// caller got ErrClosed, and the value the compute returns later is not
// committed.
func TestCloseGivesUpOnAComputeThatIgnoresItsContext(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, url, store) // a lease TTL of 1s
	started, releasec := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(releasec) })
	defer release()
	fn := func(context.Context) (*payload.Value, error) {
		close(started)
		<-releasec
		return embedding(4), nil
	}
	got := make(chan result, 1)
	go func() {
		v, path, err := c.GetOrComputePath(ctx, "r", ref(4), fn)
		got <- result{v, path, err}
	}()
	<-started
	c.Close()
	// The caller's result is settled already: its ctx ended with Close,
	// and the compute has not returned.
	release()
	if r := within(t, got); !errors.Is(r.err, ErrClosed) {
		t.Errorf("the computing request got %v %v, want ErrClosed", r.path, r.err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.WaitFlight(wctx, ref(4)); err != nil {
		t.Fatal(err)
	}
	if e := recordOf(t, url, ref(4)); e.Live && e.Record.State == lease.StateCommitted {
		t.Error("a compute that returned after Close was committed")
	}
	if _, err := store.Open(ctx, ref(4).Object()); !errors.Is(err, payload.ErrNotFound) {
		t.Error("a compute that returned after Close wrote its payload")
	}
}

// TestCallsAfterCloseAreRefused: every call that may use the store is
// ErrClosed once Close has begun, and does nothing.
func TestCallsAfterCloseAreRefused(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store := payload.NewMemoryStore("test-node", 0)
	c := newCache(t, url, store, WithEvents(0), WithLeaseTTL(30*time.Second))
	res, err := c.Reserve(ctx, ref(5))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	var n counter
	if _, err := c.GetOrCompute(ctx, "r", ref(6), n.fn(6)); !errors.Is(err, ErrClosed) {
		t.Errorf("GetOrCompute: %v", err)
	}
	if _, _, err := c.Get(ctx, "r", ref(6)); !errors.Is(err, ErrClosed) {
		t.Errorf("Get: %v", err)
	}
	if _, err := c.Reserve(ctx, ref(7)); !errors.Is(err, ErrClosed) {
		t.Errorf("Reserve: %v", err)
	}
	if _, err := res.Commit(ctx, embedding(5)); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit: %v", err)
	}
	if err := res.Abandon(ctx, errors.New("done")); !errors.Is(err, ErrClosed) {
		t.Errorf("Abandon: %v", err)
	}
	if err := c.Invalidate(ctx, "acme", "m", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Invalidate: %v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := c.Ping(pctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Ping: %v", err)
	}
	if n.n[6].Load() != 0 {
		t.Error("computed after Close")
	}
	if e := recordOf(t, url, ref(6)); e.Live {
		t.Errorf("reserved after Close: %+v", e.Record)
	}
	if e := recordOf(t, url, ref(5)); !e.Live || e.Record.State != lease.StateComputing {
		t.Errorf("the reservation was committed or abandoned after Close: %+v", e)
	}
}

// TestASecondCloseWaitsForTheFirst: a Close called while another is in
// progress returns only once that one has finished (here: once it has
// given up on a compute that ignores its ctx, then closed the event
// link, whose subscriptions are gone).
func TestASecondCloseWaitsForTheFirst(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	store := payload.NewMemoryStore("test-node", 0)
	nc := connect(t, url)
	// A request first: the connection's reply subscription, which stays,
	// is there before the Cache's.
	nc.Request("test.nobody", nil, time.Second)
	subs := nc.NumSubscriptions()
	c, err := New(ctx, nc, route(t, payload.TransportMemory, store), WithLeaseTTL(time.Second),
		WithNode("test-node"), WithEvents(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitFor(t, func() bool { return c.eventLink() != nil })
	started, releasec := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(releasec) })
	defer release()
	got := make(chan result, 1)
	go func() {
		v, path, err := c.GetOrComputePath(ctx, "r", ref(9), func(context.Context) (*payload.Value, error) {
			close(started)
			<-releasec // ignores its ctx: the first Close waits a lease TTL for it
			return embedding(9), nil
		})
		got <- result{v, path, err}
	}()
	<-started
	first := make(chan struct{})
	go func() {
		defer close(first)
		c.Close()
	}()
	<-c.life.Done() // the first Close has begun
	c.Close()
	if now := nc.NumSubscriptions(); now != subs {
		t.Errorf("the second Close returned before the first had finished (%d subscriptions, %d before it)", now, subs)
	}
	<-first
	release()
	if r := within(t, got); !errors.Is(r.err, ErrClosed) {
		t.Errorf("the computing request got %v %v, want ErrClosed", r.path, r.err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.WaitFlight(wctx, ref(9)); err != nil {
		t.Fatal(err)
	}
}

// closeDuringCreate is a lease store whose creates start the Cache's
// Close (on a goroutine of its own: Close waits for the request that
// creates) and land only once Close has begun. An answer its caller no
// longer waits for is lost, as a reply to a request that gave up is.
type closeDuringCreate struct {
	lease.Store
	closing func() // starts Close, returns once it has begun
}

func (s closeDuringCreate) Create(ctx context.Context, key string, r lease.Record, ttl time.Duration) (uint64, error) {
	s.closing()
	rev, err := s.Store.Create(context.WithoutCancel(ctx), key, r, ttl) // it lands
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return rev, err
}

// TestCloseGivesBackAReservationThatLandsAfterIt: a reservation whose
// create was sent before Close began and lands after is given back
// (purged on its revision) before Close returns: other processes need
// not wait out its lease TTL. For Reserve and for GetOrCompute's.
func TestCloseGivesBackAReservationThatLandsAfterIt(t *testing.T) {
	for _, call := range []struct {
		name    string
		reserve func(c *Cache) error
	}{
		{"Reserve", func(c *Cache) error { _, err := c.Reserve(context.Background(), ref(10)); return err }},
		{"GetOrCompute", func(c *Cache) error {
			_, err := c.GetOrCompute(context.Background(), "r", ref(10), noCompute(t))
			return err
		}},
	} {
		t.Run(call.name, func(t *testing.T) {
			url := startServer(t).ClientURL()
			store := payload.NewMemoryStore("test-node", 0)
			var c *Cache
			closed := make(chan struct{})
			closing := func() {
				go func() {
					defer close(closed)
					c.Close()
				}()
				<-c.life.Done()
			}
			hook := func(s *settings) error {
				s.leaseStore = func(st lease.Store) lease.Store { return closeDuringCreate{st, closing} }
				return nil
			}
			c = newCache(t, url, store, WithLeaseTTL(30*time.Second), hook)
			if err := call.reserve(c); !errors.Is(err, ErrClosed) {
				t.Errorf("the reservation in flight got %v, want ErrClosed", err)
			}
			<-closed
			if e := recordOf(t, url, ref(10)); e.Live {
				t.Errorf("Close returned with the reservation live (rev %d, %v): other processes wait out its lease TTL", e.Rev, e.Record.State)
			}
		})
	}
}

// TestCloseEndsTheReservationsItStops: a Reservation its caller had not
// committed nor abandoned ends with Close (Done closes, Err wraps
// ErrClosed); its record is left to expire, as a stopped process's is.
func TestCloseEndsTheReservationsItStops(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	c := newCache(t, url, payload.NewMemoryStore("test-node", 0), WithLeaseTTL(30*time.Second))
	res, err := c.Reserve(ctx, ref(11))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-res.Done():
	default:
		t.Fatal("the reservation Close stopped has not ended (Done is open)")
	}
	if err := res.Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("Err of the reservation Close stopped: %v, want ErrClosed", err)
	}
	if e := recordOf(t, url, ref(11)); !e.Live || e.Record.State != lease.StateComputing {
		t.Errorf("the stopped reservation's record was written: %+v", e)
	}
}

// TestCloseLetsAnInvalidationPublishItsEvent: an Invalidate that has
// written its tombstone when Close begins still publishes its
// invalidated event, before Close returns, and returns nil: no tombstone
// is left without the event that drops the other processes' copies.
// (Close begins from inside the Invalidate, on a goroutine of its own:
// Close waits for the Invalidate.)
func TestCloseLetsAnInvalidationPublishItsEvent(t *testing.T) {
	ctx := context.Background()
	url := startServer(t).ClientURL()
	var c *Cache
	closed := make(chan struct{})
	hook := func(s *settings) error {
		s.tombstoneWritten = func(closing context.Context) {
			go func() {
				defer close(closed)
				c.Close()
			}()
			<-closing.Done() // Close has begun
		}
		return nil
	}
	c = newCache(t, url, payload.NewMemoryStore("test-node", 0), WithEvents(0), hook)
	waitFor(t, func() bool { return c.eventLink() != nil })
	err := c.Invalidate(ctx, "acme", "m", 1)
	<-closed
	js, jerr := jetstream.New(connect(t, url))
	if jerr != nil {
		t.Fatal(jerr)
	}
	stream, jerr := js.Stream(ctx, events.StreamName)
	if jerr != nil {
		t.Fatal(jerr)
	}
	e := events.Event{Kind: events.KindInvalidated, Tenant: "acme", Key: events.InvalidationKey("m", 1)}
	if _, jerr := stream.GetLastMsgForSubject(ctx, e.Subject()); jerr != nil {
		t.Errorf("Close returned, the tombstone written, without the invalidated event: %v (Invalidate: %v)", jerr, err)
	}
	if err != nil {
		t.Errorf("Invalidate: %v, want nil (its event was published)", err)
	}
}
