package coordinator

import (
	"sync/atomic"

	"github.com/embcache/embcache/payload"
)

// traffic counts what a process's cluster view (package live) sums over
// every process: requests by the path that answered them, and payload
// bytes by transport. Counters only, so that a summary that is lost loses
// no totals.
type traffic struct {
	requests [PathDegraded + 1]atomic.Uint64 // indexed by Path; [0] unused
	pulled   [len(transports)]atomic.Uint64  // indexed as transports
	written  [len(transports)]atomic.Uint64
}

// transports are the names bytes are counted under; any other transport
// (a newer one) is counted as "other".
var transports = [...]string{payload.TransportShm, payload.TransportHTTP, payload.TransportMooncake, payload.TransportMemory, "other"}

func transportIndex(name string) int {
	for i, t := range transports[:len(transports)-1] {
		if t == name {
			return i
		}
	}
	return len(transports) - 1
}

// request counts a request answered by path (0: it failed, not counted).
func (t *traffic) request(path Path) {
	if path > 0 && int(path) < len(t.requests) {
		t.requests[path].Add(1)
	}
}

// snapshot fills s's Requests, PulledBytes and WrittenBytes, leaving out
// the zeros.
func (t *traffic) snapshot(s *Stats) {
	s.Requests = map[string]uint64{}
	for p := PathLocalHit; p <= PathDegraded; p++ {
		if n := t.requests[p].Load(); n > 0 {
			s.Requests[p.String()] = n
		}
	}
	s.PulledBytes, s.WrittenBytes = map[string]uint64{}, map[string]uint64{}
	for i, name := range transports {
		if n := t.pulled[i].Load(); n > 0 {
			s.PulledBytes[name] = n
		}
		if n := t.written[i].Load(); n > 0 {
			s.WrittenBytes[name] = n
		}
	}
}
