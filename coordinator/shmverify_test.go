package coordinator

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// TestFlippedShmByteIsRecomputed: one flipped data byte in a committed
// value's shm file (trailer intact) is a miss for the next process of the
// node, never a hit: it recomputes, the file is written again, and the
// process after it hits the genuine value.
func TestFlippedShmByteIsRecomputed(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	store, err := shm.Open(filepath.Join(t.TempDir(), "shm"), shm.WithNode("test-node"))
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{shmRoute(t, store)}
	var cnt counter
	const k = 70
	r := ref(k)
	writer := newCache(t, srv.ClientURL(), store, opts...)
	if _, err := writer.GetOrCompute(ctx, "w", r, cnt.fn(k)); err != nil {
		t.Fatal(err)
	}
	writer.Release("w")

	path := store.Path(r.Object())
	os.Chmod(path, 0o644)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	off := payload.DataOffset(embedding(k)) + 100
	f.ReadAt(b, off)
	b[0] ^= 1
	f.WriteAt(b, off)
	f.Close()

	reader := newCache(t, srv.ClientURL(), store, opts...)
	v, path2, err := reader.GetOrComputePath(ctx, "r", r, cnt.fn(k))
	if err != nil || path2 != PathComputed {
		t.Fatalf("after the flip: %v %v, want a recompute", path2, err)
	}
	sameValue(t, v, k)
	reader.Release("r")
	if n := reader.Stats().PayloadErrors; n != 1 {
		t.Fatalf("payload errors %d, want 1", n)
	}

	next := newCache(t, srv.ClientURL(), store, opts...)
	v, path2, err = next.GetOrComputePath(ctx, "n", r, cnt.fn(k))
	if err != nil || path2 != PathRemoteHit {
		t.Fatalf("after the recompute: %v %v, want a hit", path2, err)
	}
	sameValue(t, v, k)
	next.Release("n")
	if n := cnt.n[k].Load(); n != 2 {
		t.Fatalf("%d computes, want 2", n)
	}
}
