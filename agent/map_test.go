package agent_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
)

// A hit whose file is replaced before the client maps it (another value
// of the key placed at its name) is refused, never mapped as the value:
// the file's trailer is not the hit's checksum.
func TestMapRefusesAHitsFileReplacedSince(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	k := keyOf(t, c, "image-1")
	res, err := c.Lookup(ctx, k, "r1")
	if err != nil || res.Status != agent.StatusReserved {
		t.Fatalf("lookup: %+v %v", res, err)
	}
	if _, err := c.Commit(ctx, res.Reservation, "r1", "float32", []int64{4}, bytes.Repeat([]byte{1}, 16)); err != nil {
		t.Fatal(err)
	}
	hit, err := c.Lookup(ctx, k, "r2")
	if err != nil || hit.Status != agent.StatusHit {
		t.Fatalf("second lookup: %+v %v", hit, err)
	}
	if got := mapped(t, hit.Value); !bytes.Equal(got, bytes.Repeat([]byte{1}, 16)) {
		t.Fatalf("mapped %v", got)
	}
	obj, err := payload.ParseObjectID(k.Tenant + "/" + k.Key)
	if err != nil {
		t.Fatal(err)
	}
	other := payload.NewTensor(cachekey.Float32, []int64{4}, bytes.Repeat([]byte{2}, 16))
	if _, err := n.store.Put(ctx, obj, other); err != nil {
		t.Fatal(err)
	}
	if data, _, err := agent.Map(hit.Value); !errors.Is(err, agent.ErrReplaced) {
		t.Fatalf("a hit mapped after its file was replaced: %v, %v; want ErrReplaced", data, err)
	}
}
