// Package httppull is the pure-Go payload transport across nodes. A node
// that holds a value serves it over HTTP(S) at
//
//	GET /v1/payload/<tenant>/<keyhex>
//
// from a local source (the shm store or a memory store), with its size and
// checksum in headers; a puller streams the body into one buffer, hashing
// as it reads, and verifies it before decoding (Get), or hands the body to
// a store that hashes it as it writes it (Stream, shm.Store.Receive). A
// replica that pulled a value can put it in its own source and serve it in
// turn.
//
// The server serves only content-addressed objects it holds: any other
// path is 400, an absent object 404. With a bearer token, a request
// without it gets 401 and nothing else.
//
// A puller reads the address it pulls from out of a record, which anyone
// who can write the bucket can plant: it pulls only from the servers it
// was configured to trust (WithPeers, and its own advertised address), so
// that its token goes nowhere else. Without peers, one with a token
// trusts its own address only, and one without pulls from any address.
package httppull
