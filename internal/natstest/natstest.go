// Package natstest starts what tests run against: a real NATS server with
// JetStream (file storage in the test's temporary directory) and
// connections to it, all closed when the test ends.
package natstest

import (
	"context"
	"testing"

	"github.com/embcache/embcache/embedded"
	"github.com/nats-io/nats.go"
)

// Server starts a one-node server for t.
func Server(t testing.TB) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// Connect connects to url for t.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Conn starts a server for t and connects to it.
func Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return Connect(t, Server(t).ClientURL())
}

// Cluster starts an n-node cluster on loopback for t (within ctx, which
// bounds its forming) and connects to it.
func Cluster(ctx context.Context, t testing.TB, n int) (*embedded.Cluster, *nats.Conn) {
	t.Helper()
	cl, err := embedded.StartCluster(ctx, n, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Shutdown)
	nc, err := cl.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return cl, nc
}
