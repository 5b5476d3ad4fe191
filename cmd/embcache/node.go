package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/exporter"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// nodeFlags configure how a process joins the cluster: node.Options as flags.
type nodeFlags struct {
	o    node.Options
	conn natsFlags     // --nats, its credentials and client TLS
	nats []nats.Option // more connection options (serve's embedded server's TLS)
}

// register adds every flag of a node with a Cache (worker, agent).
func (f *nodeFlags) register(fs *pflag.FlagSet) {
	o := &f.o
	f.conn.register(fs)
	f.registerServing(fs, "replicas of the bucket and stream when this process creates them", "lease TTL")
	fs.StringVar(&o.Advertise, "advertise", "", "base URL other nodes pull payloads from (default http://<payload-listen>, this host's name for a listener on every address such as :7070). Without --payload-listen there is no default: set it to this node's serve pull server (e.g. http://HOST:7400) for other nodes to pull this node's values; unset, they are shm files only this node reads")
	fs.StringSliceVar(&o.PayloadPeers, "payload-peers", splitList(envOr("EMBCACHE_PAYLOAD_PEERS", "")),
		"the pull servers this node trusts (host:port or http(s)://host:port, comma-separated): it pulls only from them and sends --payload-token only to them "+
			"(default: with a token, its own --advertise only; without one, any server) ($EMBCACHE_PAYLOAD_PEERS)")
	fs.DurationVar(&o.PayloadSweep, "payload-sweep", 0, "how often to remove shm files no committed record names (0: half the store TTL, 30s-10m; <0: never)")
	fs.BoolVar(&o.Strict, "strict", false, "fail instead of computing locally when NATS is unreachable")
	fs.StringVar(&o.SummaryTenant, "summary-tenant", "", "publish the live summary on this tenant's subjects (embcache.sum.<tenant>.>: a NATS user of the single-account layout may publish only its tenant's); default: every tenant of the account's")
}

// registerServing adds the flags a node without a Cache (serve) takes too:
// its name, shm store, payload transport and the cluster's TTLs.
func (f *nodeFlags) registerServing(fs *pflag.FlagSet, replicasHelp, leaseHelp string) {
	o := &f.o
	fs.StringVar(&o.Name, "node", hostname(), "this node's name in leases and locations")
	fs.StringVar(&o.ShmDir, "shm-dir", shm.DefaultDir, "shared-memory payload directory: this user's own, refused if another user owns it, may write it or it is a link (made 0700, files 0400)")
	fs.StringVar(&o.ShmGroup, "shm-group", "", "group (name or gid) whose members may read the shm payloads and, on agent, connect to --socket and write slots: "+
		"the group of the vLLM processes that run as another user (directories 0750 set-group-ID, files 0440; this process must be root or a member)")
	fs.Int64Var(&o.ShmMaxBytes, "shm-max-bytes", 0, "budget of the shm payload store in bytes (0: the store's default)")
	fs.StringVar(&o.Payload, "payload", "", "payload transport this node writes with: shm, http or mooncake (default http with --payload-listen, else shm)")
	fs.StringVar(&o.PayloadListen, "payload-listen", "", "serve payloads over HTTP on this address (for other nodes)")
	fs.StringVar(&o.PayloadToken, "payload-token", envOr("EMBCACHE_PAYLOAD_TOKEN", ""), "bearer token the payload server requires, and pulls send to --payload-peers ($EMBCACHE_PAYLOAD_TOKEN)")
	fs.IntVar(&o.Replicas, "replicas", 1, replicasHelp)
	fs.IntVar(&o.LeaseShards, "lease-shards", 0, "KV buckets the lease keys spread over, when this process creates the bucket (0: as the bucket records; 1 for a new one)")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", coordinator.DefaultLeaseTTL, leaseHelp)
	fs.DurationVar(&o.ClockAllowance, "clock-allowance", 0, "how far the NATS servers' and processes' clocks may disagree (default: a fifth of --lease-ttl, at most 1s)")
	fs.DurationVar(&o.StoreTTL, "store-ttl", time.Hour, "committed record TTL (1s to 24h)")
	fs.DurationVar(&o.SummaryInterval, "summary-interval", 0, "how often this process announces its live summary to embcache top and serve's page (0: 2s; <0: never)")
	fs.Int64Var(&o.EventsMaxBytes, "events-max-bytes", 0, "the event stream's size limit in bytes, at least 1 MiB (0: 1 GiB for a stream this process creates, an existing one's own); serve's reconciler also sets it on an existing stream (docs/scaling.md says how to size it)")
	m := &o.Mooncake
	fs.StringVar(&m.MasterServerAddr, "mooncake-master", "", "--payload mooncake: the master server's address (host:port)")
	fs.StringVar(&m.Library, "mooncake-lib", "", "--payload mooncake: path of libmooncake_store.so (default: the loader's search path)")
	fs.StringVar(&m.MetadataServer, "mooncake-metadata", "", "--payload mooncake: metadata server (default P2PHANDSHAKE)")
	fs.StringVar(&m.LocalHostname, "mooncake-hostname", "", "--payload mooncake: the address peers reach this node at (default --node)")
	fs.StringVar(&m.Protocol, "mooncake-protocol", "", "--payload mooncake: tcp or rdma (default tcp)")
	fs.StringVar(&m.DeviceName, "mooncake-device", "", "--payload mooncake: RDMA devices (default: Mooncake chooses)")
	fs.Uint64Var(&m.GlobalSegmentSize, "mooncake-segment-bytes", 512<<20, "--payload mooncake: bytes of memory this process contributes to the store, which holds the values: give it to the node's long-lived process (serve, the agent); 0 for a short-lived worker, whose objects would vanish when it exits")
	fs.Uint64Var(&m.LocalBufferSize, "mooncake-buffer-bytes", 0, "--payload mooncake: transfer buffer bytes (default 128 MiB)")
}

// start builds the node from the flags and starts it. An invalid
// combination of flags, or a transport this binary lacks, is a usage error.
func (f *nodeFlags) start(ctx context.Context, logger *slog.Logger, tel *exporter.Exporter, extra ...coordinator.Option) (*node.Node, error) {
	o := f.o
	// --mooncake-segment-bytes 0 is no segment (the library's 0 is its
	// default, 512 MiB, which the flag shows instead).
	if o.Mooncake.GlobalSegmentSize == 0 {
		o.Mooncake.NoSegment = true
	}
	// Zero is the library's "default": typed on the command line it is a
	// mistake (--lease-ttl 0s ran with 5s while 1ms was refused).
	if o.LeaseTTL <= 0 || o.StoreTTL <= 0 {
		return nil, usagef("--lease-ttl %v, --store-ttl %v: each must be above 0", o.LeaseTTL, o.StoreTTL)
	}
	conn, err := f.natsOptions()
	if err != nil {
		return nil, err
	}
	o.NATSURL, o.NATSOptions = f.conn.url, conn
	o.Logger, o.Cache, o.Version = logger, extra, version
	if tel != nil {
		o.MeterProvider = tel.Meters
		if tel.Traces != nil {
			o.TracerProvider = tel.Traces
		}
	}
	n, err := node.New(o)
	if err != nil {
		return nil, nodeError(err)
	}
	if err := n.Start(ctx); err != nil {
		return nil, nodeError(err)
	}
	return n, nil
}

// natsOptions are the options the node connects to NATS with: the
// flags' credentials and TLS, and the embedded server's TLS (serve's).
func (f *nodeFlags) natsOptions() ([]nats.Option, error) {
	conn, err := f.conn.options()
	if err != nil {
		return nil, err
	}
	return append(append([]nats.Option(nil), f.nats...), conn...), nil
}

// dial opens a connection of its own to the node's NATS, with the URL,
// credentials and TLS the node connects with, named name: for what
// should not queue on the node's connection (serve's page follows every
// lease write of the cluster). It fails, rather than retries, if no
// server answers. The caller closes it.
func (f *nodeFlags) dial(name string) (*nats.Conn, error) {
	opts, err := f.natsOptions()
	if err != nil {
		return nil, err
	}
	return coordinator.Connect(f.conn.url, coordinator.ModeStrict, append(opts, nats.Name(name))...)
}

// printPayloadAddr tells w where the node serves pulls, if it does.
func printPayloadAddr(w io.Writer, command string, n *node.Node) {
	if addr := n.PayloadAddr(); addr != "" {
		fmt.Fprintf(w, "embcache %s: payloads at http://%s%s, advertised as %s\n", command, addr, httppull.PathPrefix, n.PayloadAdvertise())
	}
}

// nodeError makes node.New's errors usage errors: flags that do not go
// together, a --lease-shards other than the bucket's, or a transport this
// binary lacks.
func nodeError(err error) error {
	if errors.Is(err, node.ErrInvalidOption) || errors.Is(err, node.ErrMooncakeNotBuilt) || errors.Is(err, lease.ErrShards) ||
		errors.Is(err, coordinator.ErrInvalidOption) || errors.Is(err, httppull.ErrBadAdvertise) {
		return usageError{err}
	}
	return err
}
