//go:build mooncake && cgo

package node

import (
	"io"
	"log/slog"

	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/mooncake"
)

// mooncakeBuilt says whether PayloadMooncake is in this binary.
const mooncakeBuilt = true

// mooncakeTransport is what the Cache needs of a Mooncake store, and Close.
type mooncakeTransport interface {
	payload.Transport
	io.Closer
}

// openMooncake opens the Mooncake store node writes to, filling o's
// defaults; logger hears when the store's master stops answering and
// when it answers again.
func openMooncake(node string, o MooncakeOptions, logger *slog.Logger) (mooncakeTransport, error) {
	cfg := mooncake.Config{Library: o.Library, Node: node, LocalHostname: o.LocalHostname, MetadataServer: o.MetadataServer,
		GlobalSegmentSize: o.GlobalSegmentSize, LocalBufferSize: o.LocalBufferSize, Protocol: o.Protocol,
		DeviceName: o.DeviceName, MasterServerAddr: o.MasterServerAddr, Logger: logger}
	if cfg.LocalHostname == "" {
		cfg.LocalHostname = node
	}
	if cfg.MetadataServer == "" {
		cfg.MetadataServer = "P2PHANDSHAKE"
	}
	if cfg.Protocol == "" {
		cfg.Protocol = "tcp"
	}
	if cfg.GlobalSegmentSize == 0 && !o.NoSegment {
		cfg.GlobalSegmentSize = 512 << 20
	}
	if cfg.LocalBufferSize == 0 {
		cfg.LocalBufferSize = 128 << 20
	}
	return mooncake.Open(cfg)
}
