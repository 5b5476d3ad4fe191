package coordinator

import (
	"sync/atomic"

	"github.com/embcache/embcache/localcache"
)

type counters struct {
	localHits, remoteHits, computes, computeErrors, waits, takeovers atomic.Uint64
	degraded, leasesLost, commitsRefused, badRecords, payloadErrors  atomic.Uint64
	touches, lateWrites, staleTakeovers, badRecordsPurged            atomic.Uint64
}

// Stats counts what a Cache did.
type Stats struct {
	LocalHits      uint64 // answered from this process's cache
	RemoteHits     uint64 // pulled a value committed elsewhere
	Computes       uint64 // fn ran and succeeded here
	ComputeErrors  uint64 // fn failed here
	Waits          uint64 // waited for another process's compute
	Takeovers      uint64 // reserved a key after someone else had held it
	Degraded       uint64 // computed without the store
	LeasesLost     uint64 // leases lost while computing
	CommitsRefused uint64 // commits the fencing refused
	BadRecords     uint64 // lease records that did not decode
	PayloadErrors  uint64 // committed payloads that could not be read or verified
	Touches        uint64 // touched events queued (coalesced hits)
	// LateWrites counts lease writes (reserves, renewals, commits) that
	// the server acknowledged after their revision's deadline: not trusted,
	// the lease was given up.
	LateWrites uint64
	// StaleTakeovers counts computing records that had not been renewed
	// for two lease TTLs (a dead or foreign holder): purged and taken over.
	StaleTakeovers uint64
	// BadRecordsPurged counts records that did not decode, purged once
	// older than a lease TTL so that their key is shared again.
	BadRecordsPurged uint64
	// StoreReachable is true while the bucket is open and the NATS
	// connection is up. A server gone without closing the connection
	// (a partition) shows here only once the client's pings fail, minutes
	// later; Ping asks the server.
	StoreReachable bool
	Local          localcache.Stats
}

// Stats returns a snapshot.
func (c *Cache) Stats() Stats {
	return Stats{
		LocalHits: c.stats.localHits.Load(), RemoteHits: c.stats.remoteHits.Load(),
		Computes: c.stats.computes.Load(), ComputeErrors: c.stats.computeErrors.Load(),
		Waits: c.stats.waits.Load(), Takeovers: c.stats.takeovers.Load(),
		Degraded: c.stats.degraded.Load(), LeasesLost: c.stats.leasesLost.Load(),
		CommitsRefused: c.stats.commitsRefused.Load(), BadRecords: c.stats.badRecords.Load(),
		PayloadErrors: c.stats.payloadErrors.Load(), Touches: c.stats.touches.Load(),
		LateWrites: c.stats.lateWrites.Load(), StaleTakeovers: c.stats.staleTakeovers.Load(),
		BadRecordsPurged: c.stats.badRecordsPurged.Load(),
		StoreReachable:   c.storeReachable(),
		Local:            c.local.Stats(),
	}
}
