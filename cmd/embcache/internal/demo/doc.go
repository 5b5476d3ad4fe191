// Package demo is the driver behind embcache demo, worker and loadgen: the
// worker that answers requests for the embedding of demo input N through a
// Cache (as JSON lines or over HTTP), Run, which starts an embedded NATS
// server, a reconciler node and worker processes and sends a Zipf workload
// through them with the cache on and then off, and Load, which sends the
// same workload to workers over HTTP (the docker-compose test).
//
// The inputs, the stand-in encoder and the workload come from
// internal/workload; the command line (cmd/embcache) only maps flags and
// prints what these return.
//
// The protocol between a driver and a worker is Request, Result and
// WorkerStats as JSON: one object a line on a worker's stdin and stdout
// (the first line a worker writes says it is ready; a Request with a
// negative ID asks for its WorkerStats), or POST /v1/request, GET
// /v1/stats and GET /healthz with --listen.
package demo
