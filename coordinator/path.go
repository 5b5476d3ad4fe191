package coordinator

import (
	"context"
	"strconv"

	"github.com/embcache/embcache/payload"
)

// ComputeFunc computes a value on a miss (runs the encoder).
type ComputeFunc func(ctx context.Context) (*payload.Value, error)

// Path says where GetOrCompute found a value.
type Path uint8

// Paths.
const (
	PathLocalHit  Path = iota + 1 // this process's cache
	PathCoalesced                 // an in-process compute or pull another request started
	PathRemoteHit                 // pulled a value another process had committed
	PathWaited                    // waited for another process to compute, then pulled
	PathComputed                  // reserved the key and computed it
	PathDegraded                  // computed locally, not shared: the store unreachable, or the key's record of other labels (docs/protocol.md 4.4)
)

// String returns the path's name as spans and metrics label it.
func (p Path) String() string {
	switch p {
	case PathLocalHit:
		return "local-hit"
	case PathCoalesced:
		return "coalesced"
	case PathRemoteHit:
		return "remote-hit"
	case PathWaited:
		return "waited"
	case PathComputed:
		return "computed"
	case PathDegraded:
		return "degraded"
	}
	return "Path(" + strconv.Itoa(int(p)) + ")"
}
