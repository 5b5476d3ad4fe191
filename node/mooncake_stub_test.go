//go:build !(mooncake && cgo)

package node_test

import (
	"errors"
	"testing"

	"github.com/embcache/embcache/node"
)

func TestMooncakeNeedsTheTag(t *testing.T) {
	_, err := node.New(node.Options{NATSURL: "nats://x", Name: "n", Payload: node.PayloadMooncake})
	if !errors.Is(err, node.ErrMooncakeNotBuilt) {
		t.Fatalf("got %v", err)
	}
}
