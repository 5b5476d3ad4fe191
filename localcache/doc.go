// Package localcache is the in-process layer of embcache: an LRU bounded by
// bytes and entries, with TTLs, reference-counted pins owned by requests,
// and single-flight computation of misses.
//
// A hit or a compute pins the entry for the request that asked for it; a
// pinned entry is never evicted by size or TTL, so a long streaming request
// cannot lose its voice reference or video embedding midway. Release(req)
// drops every pin of a request (the RFC's cleanup_request); an entry whose
// TTL ran out while pinned goes on its final release.
//
// Concurrent misses of one key run the compute function once, in a
// goroutine of its own: every caller waits for it or for its own context,
// so a caller that gives up never cancels the compute the others wait for.
// The package knows nothing of NATS; the coordinator builds on it.
package localcache
