package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/localcache"
	"github.com/spf13/cobra"
)

func newAgent() *cobra.Command {
	var nf nodeFlags
	var socket, metricsListen string
	var computeTimeout, waitStore time.Duration
	var localMaxBytes int64
	var verbose bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: the cache of this node, served to its processes on a Unix socket",
		Long: "agent joins the cluster (NATS, shm payload store, optional HTTP payload server) and serves\n" +
			"the node's processes (the Python client in clients/python) on --socket: HTTP/1.1 with JSON\n" +
			"bodies; hits are answered with shm file locations, never with the tensor bytes.\n" +
			"See docs/agent.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				return usagef("--socket is required")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger := newLogger(cmd.ErrOrStderr(), verbose)
			tel, err := startTelemetry(ctx, "embcache-agent", metricsListen)
			if err != nil {
				return err
			}
			defer tel.shutdown()
			if tel.addr != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "embcache agent: metrics at http://%s/metrics\n", tel.addr)
			}
			// Pulled values land in the store the agent answers files of:
			// received there in one pass, not pulled into memory and copied.
			opts := []coordinator.Option{coordinator.WithComputeTimeout(computeTimeout), coordinator.WithPullToShm()}
			if localMaxBytes > 0 {
				opts = append(opts, coordinator.WithLocalCache(localcache.WithMaxBytes(localMaxBytes)))
			}
			n, err := nf.start(ctx, logger, tel, opts...)
			if err != nil {
				return err
			}
			defer n.Close()
			wctx, cancel := context.WithTimeout(ctx, waitStore)
			err = n.Ready(wctx)
			cancel()
			if err != nil {
				logger.Warn("embcache agent: serving without the store (computes are not shared until it is back)", "err", err)
			}
			srv, err := agent.New(n.Cache(), n.Store(), agent.WithLogger(logger))
			if err != nil {
				return err
			}
			l, err := listenUnix(socket)
			if err != nil {
				return err
			}
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				srv.Shutdown(sctx)
			}()
			fmt.Fprintln(cmd.ErrOrStderr(), "embcache agent: node", n.Name(), "listening on", socket)
			return srv.Serve(l)
		},
	}
	nf.register(cmd.Flags())
	cmd.Flags().StringVar(&socket, "socket", envOr("EMBCACHE_AGENT_SOCKET", ""), "Unix socket to serve on ($EMBCACHE_AGENT_SOCKET)")
	cmd.Flags().DurationVar(&computeTimeout, "compute-timeout", 5*time.Minute, "how long a client may hold a reservation before it is abandoned")
	cmd.Flags().DurationVar(&waitStore, "wait-store", 10*time.Second, "wait this long for the store before serving")
	cmd.Flags().Int64Var(&localMaxBytes, "local-max-bytes", 0, "local cache budget in bytes (0: the default)")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log more")
	cmd.AddCommand(newAgentGet())
	return cmd
}

// listenUnix listens on path, replacing a socket file no one answers on.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: another agent is serving there", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		os.Remove(path) // stale: its agent exited without removing it
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
