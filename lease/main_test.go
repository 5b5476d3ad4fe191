package lease

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/fakeclock"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func object(i int) payload.ObjectID {
	var k cachekey.Key
	binary.LittleEndian.PutUint64(k[:], uint64(i)+1)
	return payload.ObjectID{Tenant: "acme", Key: k}
}

func kvKey(i int) string { o := object(i); return o.Tenant + "." + o.Key.String() }

func value() *payload.Value {
	return payload.NewTensor(cachekey.Float32, []int64{1024}, make([]byte, 4096))
}

// The lease TTL is long (the server never expires the record during a
// test); only the client's clock moves past deadlines.
const longLease = 30 * time.Second

// fixture is a bucket on a real embedded server, and the hooks' record of
// what they heard. Answers of a lease's store calls can be replaced, one
// call each (onNext).
type fixture struct {
	b     *Bucket
	clock *fakeclock.Clock

	mu    sync.Mutex
	next  map[string]func(error) error // by op: "write", "read"
	lost  []Op
	late  int
	ended int
}

func newFixture(t *testing.T, direct bool) *fixture {
	t.Helper()
	nc := natstest.Conn(t)
	b, err := OpenBucket(context.Background(), nc, BucketConfig{Name: DefaultBucket, MarkerTTL: time.Minute, Direct: direct})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{b: b, clock: fakeclock.New(time.Now()), next: map[string]func(error) error{}}
}

func (f *fixture) config() Config {
	return Config{TTL: longLease, Clock: f.clock, Hooks: Hooks{
		Lost: func(_ *Lease, during Op, _ error) { f.mu.Lock(); f.lost = append(f.lost, during); f.mu.Unlock() },
		Late: func(string) { f.mu.Lock(); f.late++; f.mu.Unlock() },
		Ended: func(*Lease) {
			f.mu.Lock()
			f.ended++
			f.mu.Unlock()
		},
	}}
}

// store is the bucket as the fixture's leases see it: answers pass
// through the hooks onNext sets.
func (f *fixture) store() Store { return answeredStore{f.b, f} }

type answeredStore struct {
	*Bucket
	f *fixture
}

func (a answeredStore) Create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	rev, err := a.Bucket.Create(ctx, key, r, ttl)
	return rev, a.f.answer("create", err)
}

func (a answeredStore) CompareAndSet(ctx context.Context, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	newRev, err := a.Bucket.CompareAndSet(ctx, key, rev, r, ttl)
	return newRev, a.f.answer("write", err)
}

func (a answeredStore) Read(ctx context.Context, key string) (Entry, error) {
	cur, err := a.Bucket.Read(ctx, key)
	return cur, a.f.answer("read", err)
}

// answer passes err through the hook of op, once.
func (f *fixture) answer(op string, err error) error {
	f.mu.Lock()
	h := f.next[op]
	delete(f.next, op)
	f.mu.Unlock()
	if h != nil {
		return h(err)
	}
	return err
}

// onNext makes the answer of the next op ("create", "write" or "read") go through h.
func (f *fixture) onNext(op string, h func(error) error) {
	f.mu.Lock()
	f.next[op] = h
	f.mu.Unlock()
}

func (f *fixture) heard() (lost []Op, late int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Op(nil), f.lost...), f.late
}

// acquire takes key i's lease; the test stops its heartbeats at the end.
func (f *fixture) acquire(t *testing.T, i int) *Lease {
	t.Helper()
	now := time.Now()
	rec := Record{V: RecordVersion, State: StateComputing, Owner: "test/1/x", Nonce: "n", Started: now, Heartbeat: now}
	l, err := Acquire(context.Background(), f.store(), kvKey(i), rec, f.config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return l
}

func (f *fixture) read(t *testing.T, key string) Entry {
	t.Helper()
	cur, err := f.b.Read(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

// clusterBucket opens cfg's bucket, R3, on a new 3-node cluster (within
// ctx), once the cluster can create it.
func clusterBucket(t *testing.T, ctx context.Context, cfg BucketConfig) (*embedded.Cluster, *nats.Conn, *Bucket) {
	t.Helper()
	cl, nc := natstest.Cluster(ctx, t, 3)
	cfg.Replicas = 3
	var b *Bucket
	var err error
	until(t, ctx, "the bucket is created", func() bool {
		b, err = OpenBucket(ctx, nc, cfg)
		return err == nil
	})
	return cl, nc, b
}
