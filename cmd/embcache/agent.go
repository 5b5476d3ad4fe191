package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/node"
	"github.com/spf13/cobra"
)

// agentConfig is the agent command's flags.
type agentConfig struct {
	nf                        nodeFlags
	socket, metricsListen     string
	computeTimeout, waitStore time.Duration
	localMaxBytes             int64
	verbose                   bool
}

func newAgent() *cobra.Command {
	var c agentConfig
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: the cache of this node, served to its processes on a Unix socket",
		Long: "agent joins the cluster (NATS, shm payload store, optional HTTP payload server) and serves\n" +
			"the node's processes (the Python client in clients/python) on --socket: HTTP/1.1 with JSON\n" +
			"bodies; hits are answered with shm file locations, never with the tensor bytes.\n" +
			"See docs/agent.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.socket == "" {
				return usagef("--socket is required")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return c.run(ctx, cmd.ErrOrStderr())
		},
	}
	c.nf.register(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&c.socket, "socket", envOr("EMBCACHE_AGENT_SOCKET", ""), "Unix socket to serve on, 0600 (0660 for --shm-group), in a directory of this user's that no other user may write "+
		"(made 0700, or 0750 for --shm-group, if missing) ($EMBCACHE_AGENT_SOCKET)")
	f.DurationVar(&c.computeTimeout, "compute-timeout", 5*time.Minute, "how long a client may hold a reservation before it is abandoned")
	f.DurationVar(&c.waitStore, "wait-store", 10*time.Second, "wait this long for the store before serving")
	f.Int64Var(&c.localMaxBytes, "local-max-bytes", 0, "local cache budget in bytes (0: the default)")
	f.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "log more")
	cmd.AddCommand(newAgentGet())
	return cmd
}

// run serves the agent until ctx ends; log lines go to stderr.
func (c *agentConfig) run(ctx context.Context, stderr io.Writer) error {
	logger := newLogger(stderr, c.verbose)
	tel, err := startTelemetry(ctx, "agent", c.metricsListen, stderr)
	if err != nil {
		return err
	}
	defer stopTelemetry(tel)
	// Pulled values land in the store the agent answers files of:
	// received there in one pass, not pulled into memory and copied.
	c.nf.o.PullToShm, c.nf.o.Role = true, live.RoleAgent
	// A lookup that hands the compute to its client has answered by then:
	// its Cache counts the forward, not the request. The agent counts
	// those requests (its clients' commits; set once serving).
	var served atomic.Pointer[agent.Server]
	c.nf.o.SummaryAdd = func(s *live.Summary) {
		if srv := served.Load(); srv != nil {
			live.AddClientComputes(s, srv.Stats().Agent.Commits)
		}
	}
	opts := []coordinator.Option{coordinator.WithComputeTimeout(c.computeTimeout)}
	if c.localMaxBytes > 0 {
		opts = append(opts, coordinator.WithLocalCache(localcache.Budget{MaxBytes: c.localMaxBytes}))
	}
	// --wait-store counts from here: the node's first try at the store
	// (one op timeout) is part of the wait, not before it.
	waitUntil := time.Now().Add(c.waitStore)
	n, err := c.nf.start(ctx, logger, tel, opts...)
	if err != nil {
		return err
	}
	defer n.Close()
	printPayloadAddr(stderr, "agent", n)
	wctx, cancel := context.WithDeadline(ctx, waitUntil)
	err = n.Ready(wctx)
	cancel()
	if ctx.Err() != nil {
		return nil // stopped (a signal) while it waited for the store
	}
	if err != nil {
		logger.Warn("embcache agent: serving without the store (computes are not shared until it is back)", "err", err)
	}
	srv, err := agent.New(n.Cache(), n.Store(), agent.WithLogger(logger))
	if err != nil {
		return err
	}
	served.Store(srv)
	l, err := agent.ListenUnix(c.socket, agent.WithSocketGroup(c.nf.o.ShmGroup))
	if err != nil {
		return err
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	fmt.Fprintln(stderr, "embcache agent: node", n.Name(), "listening on", c.socket+";", valuesLine(n, c.nf.o.Advertise))
	if err := srv.Serve(l); err != nil {
		return err
	}
	// Serve returns as Shutdown begins: the commits it answered are still
	// being stored, and the node must not close under them.
	<-stopped
	fmt.Fprintln(stderr, "embcache agent: stopped")
	return nil
}

// valuesLine says where the agent's values go, and who can read them: an
// agent whose values other nodes cannot pull shares nothing across nodes.
// advertise is --advertise (the node's serve pull server, when the agent
// runs none of its own).
func valuesLine(n *node.Node, advertise string) string {
	switch n.Payload() {
	case node.PayloadHTTP:
		if a := n.PayloadAdvertise(); a != "" {
			advertise = a
		}
		return "values: http, pulled from " + advertise
	case node.PayloadMooncake:
		return "values: mooncake"
	default:
		return "values: shm files only this node reads (--advertise or --payload-listen for other nodes to pull them)"
	}
}
