// Package lease is the protocol's primitive: a lease on one key of a NATS
// JetStream KV bucket, whose revision is a fencing token.
//
// A Bucket is the KV bucket as the protocol uses it: a create that fails
// if the key is live, compare-and-set publishes that carry a per-key TTL,
// purges on a revision, and reads answered by the stream leader. A Record
// is a key's JSON value (computing, committed, or an invalidation's
// tombstone). Acquire takes a key with a computing record and returns a
// Lease that heartbeats it until it is committed, abandoned or lost;
// Bucket.Changes tells a waiter, and only a waiter, what its key's stream
// stored for it.
//
// Nothing here knows what is computed or where values live: the Cache
// (package coordinator) and the reconciler's election are both built on
// these types. docs/protocol.md section 3 specifies the records and the
// rules, and why each revision has a deadline.
package lease
