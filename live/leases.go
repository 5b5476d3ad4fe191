package live

import (
	"math"
	"strings"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
)

// electionKey is the reconciler's election record: a lease that never
// ends while a reconciler is active, shown as the reconciler and not as a
// key computing.
const electionKey = reconciler.ElectionKey

// expiryMargin is how long past its TTL (by the server's stamp) a
// computing record is still shown: the clocks of the server and of the
// Aggregator may differ, and the server's expiry marker, if any, comes
// soon after.
const expiryMargin = time.Second

// defaultLeaseTTL is taken as the lease TTL of a computing record without
// a TTL header.
const defaultLeaseTTL = coordinator.DefaultLeaseTTL

// ended is what last ended a key's lease: a commit, delete, purge or
// expiry marker, or a record that does not decode, at rev. A computing
// record of the key at or below rev heard afterwards is an earlier state
// heard late (a new stream leader republishes what it applies of its
// predecessor's entries) and does not bring the lease back. It is kept
// until any such record would have expired: stored no later than it,
// within the longest lease TTL heard.
type ended struct {
	rev   uint64
	stamp time.Time // when stored, by the server (or heard, if unknown)
}

// held is a computing record as last stored.
type held struct {
	rec      lease.Record
	rev      uint64
	stamp    time.Time     // when stored, by the server (or heard, if unknown)
	ttl      time.Duration // its TTL
	renewals int
}

// receiveStored takes a record change the bucket's streams republished.
func (a *Aggregator) receiveStored(m *nats.Msg) {
	key, c, ok := lease.DecodeStored(m)
	if !ok {
		return
	}
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	computing := c.Err == nil && c.Entry.Live && c.Entry.Record.State == lease.StateComputing
	if key == electionKey {
		if computing && (a.election == nil || c.Entry.Rev > a.election.rev) {
			a.election = newLease(c.Entry, now, a.election)
		}
		return
	}
	if lease.IsTombstoneKey(key) {
		return // a tombstone: never computing
	}
	old := a.computing[key]
	if old != nil && c.Entry.Rev != 0 && c.Entry.Rev <= old.rev {
		return // late: a newer state is known
	}
	if !computing {
		delete(a.computing, key) // committed, abandoned, expired, or unreadable
		if e, ok := a.ended[key]; c.Entry.Rev != 0 && (!ok || c.Entry.Rev > e.rev) {
			stamp := c.Entry.Stamp
			if stamp.IsZero() {
				stamp = now
			}
			a.ended[key] = ended{rev: c.Entry.Rev, stamp: stamp}
		}
		return
	}
	if e, ok := a.ended[key]; ok {
		if c.Entry.Rev != 0 && c.Entry.Rev <= e.rev {
			return // late: the lease has ended since
		}
		delete(a.ended, key) // the lease's own revision guards it now
	}
	l := newLease(c.Entry, now, old)
	a.longestTTL = max(a.longestTTL, l.ttl)
	a.computing[key] = l
}

// outlived reports whether every computing record stored no later than e
// has outlived its TTL at now, if none is longer than longestTTL.
func (e ended) outlived(now time.Time, longestTTL time.Duration) bool {
	return now.After(e.stamp.Add(max(longestTTL, defaultLeaseTTL) + expiryMargin))
}

// newLease is the lease e stores; old is what was known of the key.
func newLease(e lease.Entry, heard time.Time, old *held) *held {
	l := &held{rec: e.Record, rev: e.Rev, stamp: e.Stamp, ttl: e.TTL}
	if l.stamp.IsZero() {
		l.stamp = heard
	}
	switch {
	case old != nil && old.rec.Nonce == e.Record.Nonce:
		l.renewals = old.renewals + 1 // a heartbeat of the lease known
	case l.ttl > 0 && e.Record.Heartbeat.After(e.Record.Started):
		// First heard mid-compute: heartbeats go every third of the TTL.
		l.renewals = int(math.Round(float64(e.Record.Heartbeat.Sub(e.Record.Started)) / float64(l.ttl/3)))
	}
	return l
}

// expired reports whether l's record has outlived its TTL at now.
func (l *held) expired(now time.Time) bool {
	ttl := l.ttl
	if ttl <= 0 {
		ttl = defaultLeaseTTL // no TTL header
	}
	return now.After(l.stamp.Add(ttl + expiryMargin))
}

// view is l as a View's row at now.
func (l *held) view(key string, now time.Time) Lease {
	return Lease{Key: key, Holder: holderOf(l.rec.Owner), Owner: l.rec.Owner, Started: l.rec.Started,
		Heartbeat: l.rec.Heartbeat, AgeSec: max(0, now.Sub(l.rec.Started).Seconds()), Renewals: l.renewals, Rev: l.rev}
}

// holderOf is the node of an owner, <node>/<pid>/<nonce> (a reconciler's
// <node>/reconciler/<nonce>).
func holderOf(owner string) string {
	node, _, _ := strings.Cut(owner, "/")
	return node
}
