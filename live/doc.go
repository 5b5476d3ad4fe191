// Package live is the cluster's live view: every process (embcache serve,
// worker, agent, a library Cache that opts in) announces a small summary
// of its counters every few seconds on a core NATS subject of its own,
// embcache.sum.<tenant>.<node>.<id>, not stored; an Aggregator (embcache
// top, serve's page) subscribes to them, keeps the latest of each
// process, and turns them into cluster totals and rates: requests by
// path, hit ratio, encoder forwards and forwards saved, bytes by
// transport, the processes that are degraded. Beside the summaries it
// follows the leases computing now (from what the lease bucket's streams
// republish, lease.StoredWildcard) and the active reconciler and its lag
// (from the event stream's durable consumer), so that no process does
// more than publish its summary.
//
// A summary's counters are cumulative since its process started: a lost
// message loses no totals, only a rate's resolution, and a process that
// restarts (counters that go down) starts from zero again rather than
// making a rate negative. Publishing never blocks a request: the
// Publisher reads counters on a goroutine of its own, and a summary that
// cannot be sent is counted and skipped. docs/protocol.md section 5 is
// the wire contract, docs/scaling.md section 5 what it costs.
//
//	pub, err := live.NewPublisher(nc, "gpu-3", live.FromCache(cache), live.WithRole(live.RoleCache))
//	go pub.Run(ctx)
//
//	agg, err := live.NewAggregator(nc, live.WithLeases())
//	go agg.Run(ctx)
//	view := agg.View()
package live
