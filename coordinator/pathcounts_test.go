package coordinator

import (
	"context"
	"maps"
	"testing"

	"github.com/embcache/embcache/payload"
)

// TestStatsCountRequestsByPathAndBytesByTransport: what the cluster view
// sums. One process computes and hits its own copy; another pulls it and
// then hits it through Get; the bytes are the value's encoding, written
// once and pulled once, under the memory transport.
func TestStatsCountRequestsByPathAndBytesByTransport(t *testing.T) {
	s := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	a := newCache(t, s.ClientURL(), store)
	b := newCache(t, s.ClientURL(), store)
	ctx := context.Background()
	var cnt counter
	for _, c := range []*Cache{a, a, b} {
		if _, err := c.GetOrCompute(ctx, "r", ref(0), cnt.fn(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Get(ctx, "r", ref(0)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Get(ctx, "r", ref(1)); err == nil {
		t.Fatal("Get of a key never computed found a value")
	}
	sa, sb := a.Stats(), b.Stats()
	if want := map[string]uint64{"computed": 1, "local-hit": 1}; !maps.Equal(sa.Requests, want) {
		t.Errorf("a: requests %v, want %v", sa.Requests, want)
	}
	if want := map[string]uint64{"remote-hit": 1, "local-hit": 1}; !maps.Equal(sb.Requests, want) {
		t.Errorf("b: requests %v, want %v", sb.Requests, want)
	}
	written := sa.WrittenBytes[payload.TransportMemory]
	if written == 0 || len(sa.WrittenBytes) != 1 || len(sa.PulledBytes) != 0 {
		t.Errorf("a: written %v, pulled %v", sa.WrittenBytes, sa.PulledBytes)
	}
	if want := map[string]uint64{payload.TransportMemory: written}; !maps.Equal(sb.PulledBytes, want) || len(sb.WrittenBytes) != 0 {
		t.Errorf("b: pulled %v (want %v), written %v", sb.PulledBytes, want, sb.WrittenBytes)
	}
}
