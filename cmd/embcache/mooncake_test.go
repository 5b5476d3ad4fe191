//go:build mooncake && cgo

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
)

// TestServeMooncake runs serve in this process (built with the tag) with
// --payload mooncake over payload/mooncake's fake C store, and a Cache on
// its NATS that writes through Mooncake: a compute, then a hit pulled back
// through Mooncake once the local copy is dropped.
func TestServeMooncake(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libfake_mooncake.so")
	if out, err := exec.Command("gcc", "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib,
		"../../payload/mooncake/testdata/fake_store.c", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	mc := []string{"--payload", "mooncake", "--mooncake-master", "127.0.0.1:50051", "--mooncake-lib", lib, "--mooncake-hostname", "127.0.0.1"}
	port, _ := embedded.FreePort("127.0.0.1")
	root, out := newRoot(), &syncbuf.Buffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(append([]string{"serve", "--port", fmt.Sprint(port), "--store-dir", filepath.Join(dir, "js"),
		"--shm-dir", filepath.Join(dir, "serve-shm"), "--node", "serve", "--lease-ttl", "1s"}, mc...))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil || !strings.Contains(out.String(), "stopped") {
			t.Errorf("serve: %v\n%s", err, out.String())
		}
	}()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "ready"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) { // polling serve's startup, not ordering goroutines
			t.Fatalf("serve not ready:\n%s", out.String())
		}
	}

	n, err := node.New(node.Options{NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", port), Name: "gpu", ShmDir: filepath.Join(dir, "gpu-shm"),
		Strict: true, Payload: node.PayloadMooncake, Mooncake: node.MooncakeOptions{Library: lib, MasterServerAddr: "127.0.0.1:50051", LocalHostname: "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg := workload.Config("acme")
	key, err := cachekey.FromRawBytes(cfg, []byte("audio clip"))
	if err != nil {
		t.Fatal(err)
	}
	ref, data := coordinator.NewRef(cfg, key), bytes.Repeat([]byte{9, 8, 7}, 1000)
	for i, want := range []coordinator.Path{coordinator.PathComputed, coordinator.PathRemoteHit} {
		req := fmt.Sprint("req-", i)
		v, path, err := n.Cache().GetOrComputePath(ctx, req, ref, func(context.Context) (*payload.Value, error) {
			if i > 0 {
				return nil, errors.New("computed a committed key")
			}
			return payload.NewTensor(cachekey.Uint8, []int64{int64(len(data))}, data), nil
		})
		if err != nil || path != want || !bytes.Equal(v.Tensor.Data, data) {
			t.Fatalf("request %d: path %v (want %v) err %v", i, path, want, err)
		}
		n.Cache().Release(req)
		n.Cache().Drop(ref) // the next request resolves through the record
	}
	if s := n.Cache().Stats(); s.Computes != 1 || s.RemoteHits != 1 || s.PayloadErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
}
