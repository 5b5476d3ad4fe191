//go:build mooncake && cgo

package node_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/mooncake"
)

// buildFake compiles payload/mooncake's stand-in for libmooncake_store.so.
func buildFake(t *testing.T) string {
	t.Helper()
	lib := filepath.Join(t.TempDir(), "libfake_mooncake.so")
	out, err := exec.Command("gcc", "-Wall", "-Werror", "-shared", "-fPIC", "-o", lib,
		"../payload/mooncake/testdata/fake_store.c", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

func TestMooncakePayload(t *testing.T) {
	srv := startServer(t)
	n := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "mc", ShmDir: t.TempDir(), Payload: node.PayloadMooncake,
		Mooncake: node.MooncakeOptions{Library: buildFake(t), MasterServerAddr: "127.0.0.1:50051", LocalHostname: "127.0.0.1"}})
	data := bytes.Repeat([]byte{9, 8, 7}, 1000)
	v, path, err := n.Cache().GetOrComputePath(context.Background(), "req", ref(t, "audio"), func(context.Context) (*payload.Value, error) {
		return payload.NewTensor(cachekey.Uint8, []int64{int64(len(data))}, data), nil
	})
	if err != nil || path != coordinator.PathComputed || !bytes.Equal(v.Tensor.Data, data) {
		t.Fatalf("path %v err %v", path, err)
	}
	n.Cache().Release("req")
	if s := n.Cache().Stats(); s.Computes != 1 || s.PayloadErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMooncakeWithoutTheLibrary(t *testing.T) {
	srv := startServer(t)
	n, err := node.New(node.Options{NATSURL: srv.ClientURL(), Name: "mc", ShmDir: t.TempDir(), Payload: node.PayloadMooncake,
		Mooncake: node.MooncakeOptions{Library: filepath.Join(t.TempDir(), "missing.so"), MasterServerAddr: "127.0.0.1:50051"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); !errors.Is(err, mooncake.ErrLibrary) {
		t.Fatalf("Start: %v", err)
	}
	n.Close() // a second Close after Start's own does nothing
}
