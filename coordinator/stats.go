package coordinator

import (
	"sync/atomic"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/decodestats"
	"github.com/embcache/embcache/localcache"
)

type counters struct {
	localHits, remoteHits, computes, computeErrors, waits, takeovers atomic.Uint64
	degraded, leasesLost, commitsRefused, badRecords, payloadErrors  atomic.Uint64
	touches, lateWrites, staleTakeovers, badRecordsPurged            atomic.Uint64
	badRecordsWatched, eventsDecoded, eventsBad, invalidatedRecords  atomic.Uint64
	payloadsSwept, labelConflicts                                    atomic.Uint64
	uncommittedDeleted, uncommittedLeft                              atomic.Uint64
	traffic
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
	BadRecords     uint64 // lease records that did not decode when read
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
	// BadRecordsWatched counts changes of a key this process waited on
	// (heard from the stream's republish) whose record did not decode.
	BadRecordsWatched uint64
	// EventsDecoded and EventsBad count the events this process received
	// from the stream (WithEvents): decoded, and skipped because they did
	// not decode. docs/metrics.md has them by kind and by reason.
	EventsDecoded, EventsBad uint64
	// InvalidatedRecords counts committed records this process refused
	// because an invalidation of their model and epoch came after their
	// reservation (docs/protocol.md 4.4), and purged.
	InvalidatedRecords uint64
	// LabelConflicts counts requests whose key's record carried other
	// labels (model, epoch) than their Ref: not served that record, they
	// computed without sharing (GetOrCompute) or missed (Get). A caller
	// that labels its keys wrong shows here (docs/protocol.md 4.4).
	LabelConflicts uint64
	// PayloadsSwept counts shm files this process removed because no
	// committed record named them (WithPayloadSweep).
	PayloadsSwept uint64
	// UncommittedDeleted counts the deletes this process issued, once the
	// key had no live record, of payloads it put whose commit did not land
	// (refused, failed, cut short); a delete leaves a payload put again or
	// replaced since (docs/protocol.md 2.5). UncommittedLeft counts those
	// it gave up on (the key computing for minutes, the store refusing,
	// Close), left to the node's sweep or the store's eviction.
	UncommittedDeleted, UncommittedLeft uint64
	// StoreReachable is true while the bucket is open and the NATS
	// connection is up. A server gone without closing the connection
	// (a partition) shows here only once the client's pings fail, minutes
	// later; Ping asks the server.
	StoreReachable bool
	// Requests counts the requests answered, by the path that answered
	// them (Path.String(); paths with none left out): GetOrCompute's,
	// as embcache_requests_total counts them, and Get's hits. A request
	// that failed, or a Get that found nothing, is not counted.
	Requests map[string]uint64
	// PulledBytes counts the payload bytes of the values this process
	// pulled (remote hits, waits), and WrittenBytes those of the values
	// it committed, by the transport of their location ("shm", "http",
	// "mooncake", "memory"; a transport with none left out).
	PulledBytes, WrittenBytes map[string]uint64
	// Events is true while the event stream is in use (WithEvents, and
	// the stream reachable); Publisher has its publisher's counters.
	Events    bool
	Publisher events.PublisherStats
	Local     localcache.Stats
}

// Stats returns a snapshot.
func (c *Cache) Stats() Stats {
	s := Stats{
		LocalHits: c.stats.localHits.Load(), RemoteHits: c.stats.remoteHits.Load(),
		Computes: c.stats.computes.Load(), ComputeErrors: c.stats.computeErrors.Load(),
		Waits: c.stats.waits.Load(), Takeovers: c.stats.takeovers.Load(),
		Degraded: c.stats.degraded.Load(), LeasesLost: c.stats.leasesLost.Load(),
		CommitsRefused: c.stats.commitsRefused.Load(), BadRecords: c.stats.badRecords.Load(),
		PayloadErrors: c.stats.payloadErrors.Load(), Touches: c.stats.touches.Load(),
		LateWrites: c.stats.lateWrites.Load(), StaleTakeovers: c.stats.staleTakeovers.Load(),
		BadRecordsPurged: c.stats.badRecordsPurged.Load(), BadRecordsWatched: c.stats.badRecordsWatched.Load(),
		EventsDecoded: c.stats.eventsDecoded.Load(), EventsBad: c.stats.eventsBad.Load(),
		InvalidatedRecords: c.stats.invalidatedRecords.Load(), PayloadsSwept: c.stats.payloadsSwept.Load(),
		UncommittedDeleted: c.stats.uncommittedDeleted.Load(), UncommittedLeft: c.stats.uncommittedLeft.Load(),
		LabelConflicts: c.stats.labelConflicts.Load(),
		StoreReachable: c.storeReachable(),
		Local:          c.local.Stats(),
	}
	c.stats.traffic.snapshot(&s)
	if l := c.eventLink(); l != nil {
		s.Events, s.Publisher = true, l.pub.Stats()
	}
	return s
}

// badRecord counts a record that did not decode when read.
func (c *Cache) badRecord(err error) {
	c.obs.badRecord(err, decodestats.OpRead)
}

// badRecordWatched counts a record that did not decode, heard as a
// change while this process waited on its key.
func (c *Cache) badRecordWatched(err error) {
	c.obs.badRecord(err, decodestats.OpWatch)
}
