package live

import (
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/reconciler"
)

// FromCache is the Source of a Cache's counters (coordinator.Stats).
func FromCache(c *coordinator.Cache) Source {
	return func() Summary { return CacheFigures(c.Stats()) }
}

// CacheFigures are a Cache's counters as a summary's.
func CacheFigures(st coordinator.Stats) Summary {
	return Summary{
		Requests: st.Requests, Forwards: st.Computes + st.ComputeErrors,
		Pulled: st.PulledBytes, Written: st.WrittenBytes,
		Held: st.Local.Bytes, Pinned: st.Local.PinnedBytes,
		Degraded: st.Degraded, Lost: st.LeasesLost + st.CommitsRefused, PayloadErrors: st.PayloadErrors,
		StoreDown: !st.StoreReachable,
	}
}

// ReconcilerOf are a reconciler's counters as a summary's.
func ReconcilerOf(st reconciler.Stats) *ReconcilerFigures {
	return &ReconcilerFigures{Active: st.Active, Elected: st.Elected,
		Actions: st.Touches + st.Expired + st.Invalidated + st.PayloadDeletes}
}

// AddClientComputes adds to s the requests a process's clients computed
// themselves and committed through it (the agent's: a lookup answered
// with a reservation, then a commit). Its Cache counts their forwards
// (its compute function waits for the commit), not these requests, which
// were answered before the compute.
func AddClientComputes(s *Summary, commits uint64) {
	if commits == 0 {
		return
	}
	if s.Requests == nil {
		s.Requests = map[string]uint64{}
	}
	s.Requests["computed"] += commits
}
