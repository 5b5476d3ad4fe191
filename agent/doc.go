// Package agent is embcache's node agent: one process per node that owns
// the node's cache (a coordinator.Cache joined to the cluster) and its shm
// payload store, and serves the processes of that node (Python encoder and
// prefill stages) over HTTP/1.1 on a Unix socket, with JSON bodies.
//
// A hit is answered with where the value lies in shm (a file, the offset
// and length of the tensor data, dtype, shape): the client maps the file
// read-only, and the tensor bytes never cross the socket. A miss is
// answered with a reservation; the client computes, writes the tensor into
// a slot file (the one the answer names, or one from POST /v1/slot) and
// commits; the agent answers at once and reads, stores and shares the
// value after. While another process anywhere in the cluster computes a
// key, a lookup waits (with heartbeats, if asked).
//
// The API (docs/agent.md has the bodies):
//
//	POST /v1/key/bytes  config header + the input (or its key slot) -> key
//	POST /v1/key/slot   size -> the connection's key slot
//	POST /v1/key        config + raw bytes | decoded tensor | tokens (JSON) -> key
//	POST /v1/lookup     key -> hit | reservation (waits while another computes)
//	POST /v1/get        key -> hit | miss (never reserves, never waits)
//	POST /v1/slot       reservation, size -> a file to write the tensor into
//	POST /v1/commit     reservation + slot or bytes -> accepted
//	POST /v1/abandon    reservation
//	POST /v1/release    request id: unpin what the request looked up
//	GET  /v1/stats      counters of the agent and its cache
//	GET  /healthz       200 when the store is reachable
//
// Pins belong to the client a call names, and are released when the last
// connection that called for it closes (the client exited or was killed).
// Reservations, their slots and key slots belong to the connection that
// made them: when it closes, the agent abandons its reservations (another
// process then takes the key over) and removes its slots.
package agent
