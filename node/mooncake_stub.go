//go:build !(mooncake && cgo)

package node

import (
	"io"
	"log/slog"

	"github.com/embcache/embcache/payload"
)

// mooncakeBuilt says whether PayloadMooncake is in this binary: New
// refuses it with ErrMooncakeNotBuilt before Start could get here.
const mooncakeBuilt = false

type mooncakeTransport interface {
	payload.Transport
	io.Closer
}

func openMooncake(string, MooncakeOptions, *slog.Logger) (mooncakeTransport, error) {
	return nil, ErrMooncakeNotBuilt
}
