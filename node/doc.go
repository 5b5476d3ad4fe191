// Package node assembles an embcache node from Options, the way
// nats-server's server.New(&opts) assembles a server: the NATS connection,
// the shm payload store, the payload transport this node writes with (shm on
// one machine, HTTP across machines with a pull server for the others, or
// Mooncake in a binary built with -tags mooncake), the event stream, the
// telemetry providers, the coordinator.Cache over all of them and, with
// Options.Reconciler, a reconciler (one in the cluster is active; the
// others stand by). A node with Options.NoCache only serves: embcache
// serve is its pull server and its reconciler.
//
// It is the one place that knows how these fit together, so the commands
// (embcache serve, worker, agent and demo), the benchmarks, the tests and
// Go embedders join a cluster the same way:
//
//	n, err := node.New(node.Options{NATSURL: url, Name: "gpu-3", PayloadListen: ":7070"})
//	if err != nil { ... }                 // an invalid option: ErrInvalidOption
//	if err := n.Start(ctx); err != nil { ... }
//	defer n.Close()
//	_ = n.Ready(ctx)                      // the KV bucket answers: computes are shared
//	v, err := n.Cache().GetOrCompute(ctx, req, ref, encode)
//
// New only validates; Start connects, opens and listens; Close releases in
// the reverse order (the summary publisher, the reconciler, the Cache, the
// pull server, the Mooncake store, the connection).
package node
