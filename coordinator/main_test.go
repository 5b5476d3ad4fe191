package coordinator

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startServer(t testing.TB) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := Connect(url, ModeDegrade)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// route is the payload plane of node "test-node" writing with w, a
// transport of kind.
func route(t testing.TB, kind string, w payload.Transport, opts ...payload.RouterOption) Option {
	t.Helper()
	r, err := payload.NewRouter("test-node", kind, w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return WithPayload(r)
}

// shmRoute is the payload plane of node "test-node" writing to its shm store.
func shmRoute(t testing.TB, store *shm.Store) Option {
	return route(t, payload.TransportShm, store, payload.WithNodeStore(store))
}

// newCache is one "process": its own connection and local cache; the
// payload store is shared, as shm is between processes of one node.
func newCache(t testing.TB, url string, store payload.Transport, opts ...Option) *Cache {
	t.Helper()
	base := []Option{route(t, payload.TransportMemory, store), WithLeaseTTL(time.Second), WithNode("test-node")}
	c, err := New(context.Background(), connect(t, url), append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ref(i int) Ref {
	var k cachekey.Key
	binary.LittleEndian.PutUint64(k[:], uint64(i)+1)
	return Ref{Tenant: "acme", Key: k, Model: "m", Epoch: 1}
}

// removePayload deletes the payload at loc, whatever generation it is in:
// a payload gone.
func removePayload(t testing.TB, store payload.Transport, loc payload.Location) {
	t.Helper()
	ctx := context.Background()
	seen, err := store.Generation(ctx, loc)
	if err == nil {
		err = store.Delete(ctx, loc, seen)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// embedding is the deterministic "encoder output" of key i.
func embedding(i int) *payload.Value {
	data := make([]byte, 4096)
	for j := range data {
		data[j] = byte(i*31 + j*7)
	}
	return payload.NewTensor(cachekey.Float32, []int64{1024}, data)
}

// counter counts computes per key across every cache in the test.
type counter struct{ n [256]atomic.Int32 }

func (c *counter) fn(i int) ComputeFunc {
	return func(context.Context) (*payload.Value, error) {
		c.n[i].Add(1)
		return embedding(i), nil
	}
}

func sameValue(t testing.TB, got *payload.Value, i int) {
	t.Helper()
	if !bytes.Equal(got.Tensor.Data, embedding(i).Tensor.Data) {
		t.Fatalf("key %d: wrong bytes", i)
	}
}

func reqID(parts ...any) string { return fmt.Sprint(parts...) }

func itoa(i int) string { return fmt.Sprint(i) }

func contains(s, sub string) bool { return bytes.Contains([]byte(s), []byte(sub)) }

// waitFor waits for cond, which some background work will make true; it
// checks on a short tick and fails the test after 20s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
