package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/demo"
	"github.com/embcache/embcache/live"
	"github.com/spf13/cobra"
)

func newWorker() *cobra.Command {
	var nf nodeFlags
	var role, listen, metricsListen string
	var embedMB float64
	var encodeMS int
	var verbose bool
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run an encoder or prefill worker (what demo and docker-compose run)",
		Long: "A worker answers requests for the embedding of demo input N through the cache.\n" +
			"Requests come as JSON lines on stdin (answers on stdout), or over HTTP with --listen:\n" +
			"POST /v1/request {\"id\":1,\"image\":7,\"cache\":true}, GET /v1/stats, GET /healthz.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case role != "encoder" && role != "prefill":
				return usagef("--role must be encoder or prefill, not %q", role)
			case embedMB <= 0 || embedMB > 512: // as demo checks them
				return usagef("--embed-mb must be in (0, 512], got %v", embedMB)
			case encodeMS < 0:
				return usagef("--encode-ms must be >= 0, got %d", encodeMS)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			tel, err := startTelemetry(ctx, "worker", metricsListen, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stopTelemetry(tel)
			nf.o.Role = live.RoleWorker
			n, err := nf.start(ctx, newLogger(cmd.ErrOrStderr(), verbose), tel)
			if err != nil {
				return err
			}
			defer n.Close()
			printPayloadAddr(cmd.ErrOrStderr(), "worker", n)
			w, err := demo.NewWorker(role, n.Name(), n.Cache(), int(embedMB*(1<<20)), time.Duration(encodeMS)*time.Millisecond)
			if err != nil {
				return err
			}
			if listen == "" {
				return w.ServeLines(ctx, cmd.InOrStdin(), cmd.OutOrStdout())
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "embcache worker: role", role, "listening on", l.Addr().String())
			return w.ServeHTTP(ctx, l)
		},
	}
	nf.register(cmd.Flags())
	// A worker is short-lived: the objects of a segment it held would go
	// when it exits. It contributes none unless told to.
	seg := cmd.Flags().Lookup("mooncake-segment-bytes")
	seg.Value.Set("0")
	seg.DefValue = "0"
	cmd.Flags().StringVar(&role, "role", "prefill", "encoder or prefill")
	cmd.Flags().StringVar(&listen, "listen", "", "answer requests over HTTP on this address instead of stdin")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	cmd.Flags().Float64Var(&embedMB, "embed-mb", 8, "embedding size in MiB")
	cmd.Flags().IntVar(&encodeMS, "encode-ms", 30, "milliseconds each forward waits, standing for GPU time")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log more")
	return cmd
}
