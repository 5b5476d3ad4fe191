// Package events is embcache's event stream: what happened to each cached
// value, on JetStream stream EMBCACHE_EVENTS under subjects
//
//	embcache.ev.<tenant>.<kind>.<keyhex>
//
// Kinds: published (a value was committed), touched (a value was hit,
// coalesced per key and interval), evicted (the store copy went, with a
// cause), abandoned (a compute failed) and invalidated (every value of a
// tenant, model and weight epoch is stale). Bodies are msgpack with a schema
// version; an event that does not decode is counted and skipped.
//
// The stream keeps the last event of each subject, for longer than any
// value lives and within its MaxBytes (StreamConfig; docs/scaling.md sizes
// it), so replaying it from the start rebuilds every live entry:
// State.Apply is that fold. Publisher is the bounded asynchronous publisher
// the hot path uses; Subscribe consumes with filters.
package events
