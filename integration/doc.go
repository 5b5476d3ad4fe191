// Package integration holds the tests that need real processes: several
// workers (this package's test binary, re-executed) sharing an embedded
// NATS server and a shared-memory payload store, killed, paused and
// resumed while they hold leases.
package integration
