package node_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// untrustedPulls is how many pulls the provider's Cache refused as
// untrusted (embcache.pull.errors{reason=untrusted}).
func untrustedPulls(t *testing.T, r *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "embcache.pull.errors" || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if reason, _ := dp.Attributes.Value("reason"); reason.AsString() == "untrusted" {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestPayloadTokenGoesOnlyToPeers: a node with a payload token pulls from
// its PayloadPeers; a value whose record names another pull server (a
// hostile one, here a node without the token) is refused, counted, and
// computed locally, and the record stays for those who trust its server.
// Without peers, a node with a token pulls from no other node.
func TestPayloadTokenGoesOnlyToPeers(t *testing.T) {
	srv := startServer(t)
	base := node.Options{NATSURL: srv.ClientURL(), NoEvents: true}
	with := func(name string, f func(*node.Options)) node.Options {
		o := base
		o.Name, o.ShmDir = name, filepath.Join(t.TempDir(), "shm")
		f(&o)
		return o
	}
	a := startNode(t, with("a", func(o *node.Options) { o.PayloadListen, o.PayloadToken = "127.0.0.1:0", "s3cret" }))
	hostile := startNode(t, with("hostile", func(o *node.Options) { o.PayloadListen = "127.0.0.1:0" }))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	b := startNode(t, with("b", func(o *node.Options) {
		o.PayloadToken, o.PayloadPeers, o.MeterProvider = "s3cret", []string{a.PayloadAddr()}, mp
	}))
	noPeers := startNode(t, with("c", func(o *node.Options) { o.PayloadToken = "s3cret" }))

	trusted, planted := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	computeOn(t, a, ref(t, "on a"), trusted)
	computeOn(t, hostile, ref(t, "on hostile"), planted)
	pullOn(t, b, ref(t, "on a"), trusted)

	mine := bytes.Repeat([]byte{3}, 4096)
	degraded := func(n *node.Node, input string) {
		t.Helper()
		v, path, err := n.Cache().GetOrComputePath(context.Background(), "r", ref(t, input), func(context.Context) (*payload.Value, error) {
			return payload.NewTensor(cachekey.Uint8, []int64{4096}, mine), nil
		})
		if err != nil || path != coordinator.PathDegraded || !bytes.Equal(v.Tensor.Data, mine) {
			t.Fatalf("%s reading %q: path %v err %v, want its own compute (degraded)", n.Name(), input, path, err)
		}
		n.Cache().Release("r")
		n.Cache().Drop(ref(t, input))
	}
	degraded(b, "on hostile")
	if got := untrustedPulls(t, reader); got != 1 {
		t.Errorf("untrusted pulls counted: %d, want 1", got)
	}
	if s := b.Cache().Stats(); s.PayloadErrors != 1 {
		t.Errorf("b's PayloadErrors %d, want 1", s.PayloadErrors)
	}
	degraded(noPeers, "on a")

	// The record stays: a node that trusts the hostile server's address
	// (it has no token to give away) still pulls it.
	open := startNode(t, with("d", func(*node.Options) {}))
	pullOn(t, open, ref(t, "on hostile"), planted)

	if _, err := node.New(with("e", func(o *node.Options) { o.PayloadPeers = []string{"no-port"} })); !errors.Is(err, node.ErrInvalidOption) {
		t.Errorf("a peer without a port: %v, want ErrInvalidOption", err)
	}
}
