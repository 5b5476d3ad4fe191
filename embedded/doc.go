// Package embedded runs NATS servers with JetStream inside the process:
// one node for the one-command demo and for tests, or an N-node cluster on
// loopback ports where a node can be stopped and restarted with the same
// store. There is no global state: any number of servers can run in one
// process.
//
// JetStream storage is on files under a directory the caller owns, with
// SyncAlways on by default: a lease or record that a client saw
// acknowledged survives a crash of the node.
package embedded
