// Package reconciler keeps the lease bucket in step with the event stream,
// a process role of its own: it extends a committed record's TTL when its
// value is touched, removes payloads whose record expired and announces it
// (evicted), carries out invalidations, and purges bad records at values'
// keys that no reader asks for again (docs/protocol.md 3, rule 6).
//
// Run any number of them: one is active at a time, elected with a lease
// (package lease) on ElectionKey, and a standby takes over when it dies.
// The protocol does not depend on one running (docs/protocol.md 4.4).
//
// It keeps nothing per value (but the keys of at most 1024 bad records
// it waits to purge). It follows the bucket's messages (its
// expiry markers and purges) from where the previous active one ended, and
// reads what it needs of a value (where its payload is) from the value's
// last events when its record goes; only after a gap longer than the
// bucket's marker TTL (or at the first start) does it sweep every value
// the events know, once (docs/protocol.md 4.6).
//
// An event can be missing (a publish the stream never stored, or one it
// discarded at its MaxBytes): it looks at the stream's state every minute,
// counts what the stream discards that it needs, and every half store TTL
// (and after such discards) reads the committed records themselves and
// publishes the location of each the stream holds no event of
// (docs/protocol.md 4.6, "Locations from the bucket").
package reconciler
