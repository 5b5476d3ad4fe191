// Package reconciler keeps the lease bucket in step with the event stream,
// a process role of its own: it extends a committed record's TTL when its
// value is touched, removes payloads whose record expired and announces it
// (evicted), and carries out invalidations.
//
// Run any number of them: one is active at a time, elected with a lease
// (package lease) on ElectionKey, and a standby takes over when it dies.
// The protocol does not depend on one running (docs/protocol.md 4.4).
package reconciler
