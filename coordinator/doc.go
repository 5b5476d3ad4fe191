// Package coordinator makes one process in a whole cluster compute each
// key while the others wait for it and then pull the value.
//
// Every key has a lease on NATS JetStream KV (bucket EMBCACHE_LEASES, key
// "<tenant>.<keyhex>"): a process reserves it with a revision-checked
// create carrying a per-key TTL, heartbeats it with compare-and-set
// publishes that renew the TTL, and commits by writing the value through the
// payload plane and then setting the record to committed with the store
// TTL. The revision is a fencing token: a holder that lost its lease (it
// stalled, or its heartbeats stopped) can never commit. A process that
// waits subscribes, for the wait, to what the key's stream stores for it
// (the stream republishes each stored message: a commit, a purge, an
// expiry) and polls besides, then pulls the committed value or takes over
// when the holder's lease expires. No process but the
// reconciler follows the whole bucket: a process hears only of the keys it
// waits on.
//
// Cache is the facade: GetOrCompute checks the local cache, joins an
// in-process flight, pulls a committed value, waits for a holder, or
// reserves and computes. When NATS is unreachable it degrades to local-only
// computing (ModeDegrade, the default) or fails (ModeStrict).
// docs/protocol.md section 3 specifies the records and the protocol.
package coordinator
