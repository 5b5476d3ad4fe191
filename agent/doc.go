// Package agent is embcache's node agent: one process per node that owns
// the node's cache (a coordinator.Cache joined to the cluster) and its shm
// payload store, and serves the processes of that node (Python encoder and
// prefill stages) over HTTP/1.1 on a Unix socket, with JSON bodies.
//
// A hit is answered with where the value lies in shm (a file, the offset
// and length of the tensor data, dtype, shape): the client maps the file
// read-only, and the tensor bytes never cross the socket. A miss is
// answered with a reservation; the client computes, writes the tensor into
// a slot file the agent hands out (or posts the bytes), and commits. While
// another process anywhere in the cluster computes a key, a lookup waits.
//
// The API (docs/agent.md has the bodies):
//
//	POST /v1/key      config + raw bytes | decoded tensor | tokens -> key
//	POST /v1/lookup   key -> hit | reservation (waits while another computes)
//	POST /v1/slot     reservation, size -> a file to write the tensor into
//	POST /v1/commit   reservation + slot or bytes -> hit
//	POST /v1/abandon  reservation
//	POST /v1/release  request id: unpin what the request looked up
//	GET  /v1/stats    counters of the agent and its cache
//	GET  /healthz     200 when the store is reachable
//
// Pins, reservations and slots belong to the connection that made them:
// when it closes (the client exited or was killed), the agent releases its
// pins, abandons its reservations (another process then takes the key
// over) and removes its slots.
package agent
