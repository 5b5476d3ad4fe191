package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/live"
	"github.com/embcache/embcache/node"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

type serveConfig struct {
	nf                                        nodeFlags // the node: --nats joins an external NATS, --user is its user (and the embedded server's)
	storeDir, host, name, clusterName, routes string
	port, clusterPort                         int
	tlsCert, tlsKey, tlsCA, natsConfig        string
	noSync, noNATS, noReconciler, verbose     bool
	metricsListen                             string
}

func newServe() *cobra.Command {
	var c serveConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a node: embedded NATS, the reconciler, the payload server, /metrics",
		Long: "serve runs one embcache node until SIGINT or SIGTERM: an embedded NATS server with JetStream\n" +
			"(or, with --nats, a connection to an external one), a reconciler (one is active in the cluster,\n" +
			"the others stand by), an HTTP payload server for this node's shm store, and Prometheus /metrics.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (c.tlsCert == "") != (c.tlsKey == "") {
				return usagef("--tls-cert and --tls-key go together")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runServe(ctx, &c, cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.storeDir, "store-dir", "embcache-data", "JetStream storage directory")
	f.StringVar(&c.host, "host", "127.0.0.1", "NATS client listen host")
	f.IntVar(&c.port, "port", 4222, "NATS client port")
	f.StringVar(&c.name, "server-name", "", "NATS server name (unique in a cluster; default embcache-<port>)")
	f.StringVar(&c.clusterName, "cluster-name", "embcache", "NATS cluster name")
	f.IntVar(&c.clusterPort, "cluster-port", 0, "NATS route port (0: no cluster)")
	f.StringVar(&c.routes, "routes", "", "routes to the other nodes, comma-separated nats-route://host:port")
	c.nf.conn.add(f, "", "join this NATS instead of embedding one (implies --no-nats)",
		"the NATS user the embedded server requires, and serve connects as")
	f.StringVar(&c.tlsCert, "tls-cert", "", "the embedded NATS server's TLS certificate (PEM): clients connect with TLS")
	f.StringVar(&c.tlsKey, "tls-key", "", "the embedded NATS server's TLS key (PEM)")
	f.StringVar(&c.tlsCA, "tls-ca", "", "CA the embedded NATS server verifies client certificates with (mutual TLS)")
	f.StringVar(&c.natsConfig, "nats-config", "", "a nats-server configuration file (accounts, permissions); flags override it")
	f.BoolVar(&c.noSync, "no-sync", false, "turn JetStream SyncAlways off (faster, loses acknowledged writes on a crash)")
	f.BoolVar(&c.noNATS, "no-nats", false, "do not embed NATS; join --nats")
	f.BoolVar(&c.noReconciler, "no-reconciler", false, "do not run a reconciler on this node")
	c.nf.registerServing(f, "replicas of the bucket and stream (3 in a cluster)", "lease TTL (also the reconciler election's)")
	f.StringVar(&c.nf.o.PayloadListen, "http-listen", "", "the same as --payload-listen")
	f.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "log more (and the NATS server's log)")
	return cmd
}

func runServe(ctx context.Context, c *serveConfig, cmd *cobra.Command) error {
	out := cmd.OutOrStdout()
	var srv *embedded.Server // the embedded NATS server, if this serve runs one
	c.nf.o.NoCache, c.nf.o.Reconciler, c.nf.o.Role = true, !c.noReconciler, live.RoleServe
	if _, err := c.nf.conn.options(); err != nil {
		return err // before a server starts
	}
	if c.nf.conn.url == "" {
		if c.noNATS {
			return usagef("--no-nats needs --nats URL")
		}
		if c.nf.o.Replicas > 1 && c.clusterPort == 0 && c.natsConfig == "" { // (a config file may define the cluster)
			// One node cannot hold replicas: the stream was never made
			// (retried for good behind "ready"), and the first worker
			// made the bucket at R1 unannounced.
			return usagef("--replicas %d needs a NATS cluster: this serve embeds one node (add --cluster-port and --routes, or join one with --nats)", c.nf.o.Replicas)
		}
		// Refuse bad node flags (--payload mooncake without the tag)
		// before a server starts; its URL is known once it listens.
		probe := c.nf.o
		probe.NATSURL = "nats://embedded"
		if err := probe.Validate(); err != nil {
			return nodeError(err)
		}
		var err error
		if srv, err = c.startNATS(); err != nil {
			return err
		}
		defer srv.Shutdown()
		fmt.Fprintf(out, "embcache serve: NATS (JetStream, %s) listening at %s\n", c.storeDir, c.nf.conn.url)
	}
	tel, err := startTelemetry(ctx, "serve", c.metricsListen, out)
	if err != nil {
		return err
	}
	defer stopTelemetry(tel)
	n, err := c.nf.start(ctx, newLogger(cmd.ErrOrStderr(), c.verbose), tel)
	if err != nil {
		return err
	}
	printPayloadAddr(out, "serve", n)
	ui := serveLiveView(tel, func() (*nats.Conn, error) { return c.nf.dial("embcache serve page") },
		n.Conn().ConnectedUrlRedacted(), out)
	if !c.noReconciler {
		fmt.Fprintln(out, "embcache serve: reconciler campaigning")
	}
	if waitJetStream(ctx, n, out) {
		fmt.Fprintln(out, "embcache serve: ready (Ctrl-C to stop)")
		<-ctx.Done()
	}
	if ui != nil {
		ui.Close() // it closes its connection, before the server stops
	}
	err = n.Close()
	if srv != nil {
		srv.Shutdown() // "stopped" is said once the server is down: a hung shutdown must not read as done
	}
	fmt.Fprintln(out, "embcache serve: stopped")
	return err
}

// startNATS starts the embedded server and points the node at it.
func (c *serveConfig) startNATS() (*embedded.Server, error) {
	opts := embedded.Options{StoreDir: c.storeDir, Name: c.name, Host: c.host, Port: c.port, NoSync: c.noSync,
		Username: c.nf.conn.user, Password: c.nf.conn.pass, Logs: c.verbose,
		TLSCert: c.tlsCert, TLSKey: c.tlsKey, TLSCA: c.tlsCA, ConfigFile: c.natsConfig}
	if c.clusterPort != 0 {
		opts.ClusterName, opts.ClusterHost, opts.ClusterPort = c.clusterName, c.host, c.clusterPort
		if c.routes != "" {
			opts.Routes = strings.Split(c.routes, ",")
		}
	}
	srv, err := embedded.Start(opts)
	if errors.Is(err, embedded.ErrInvalidConfig) {
		return nil, usageError{err}
	}
	if err != nil {
		return nil, err
	}
	tc, err := srv.ClientTLS()
	if err != nil {
		srv.Shutdown()
		return nil, err
	}
	if tc != nil && !c.nf.conn.hasTLS() { // --nats-ca, --nats-cert say otherwise
		c.nf.nats = append(c.nf.nats, nats.Secure(tc))
	}
	c.nf.conn.url = srv.ClientURL()
	return srv, nil
}

// readyQuiet is how long serve waits for JetStream before it says it
// waits (a server that has just started answers within it), and how often
// it says so again if what JetStream says has changed.
const readyQuiet = 3 * time.Second

// waitJetStream waits until JetStream answers (node.Ready) and reports
// whether it did before ctx ended. "ready" is said after it, never
// before: a restarted server whose JetStream answered nothing for
// minutes, and a --nats that nothing listened at, were both announced
// ready.
func waitJetStream(ctx context.Context, n *node.Node, out io.Writer) bool {
	said := ""
	for {
		qctx, cancel := context.WithTimeout(ctx, readyQuiet)
		err := n.Ready(qctx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if msg := err.Error(); msg != said {
			fmt.Fprintf(out, "embcache serve: waiting for NATS JetStream to answer: %v\n", err)
			said = msg
		}
	}
}
