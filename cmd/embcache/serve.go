package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/httppull"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

type serveConfig struct {
	storeDir, host, name, clusterName, routes, user, pass string
	port, clusterPort, replicas                           int
	tlsCert, tlsKey, tlsCA, natsConfig                    string
	noSync, noNATS, noReconciler, verbose                 bool
	joinURL, shmDir, node, httpListen, metricsListen      string
	token                                                 string
	leaseTTL, storeTTL                                    time.Duration
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
			return runServe(ctx, c, cmd)
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
	f.StringVar(&c.user, "user", "", "require this NATS user")
	f.StringVar(&c.pass, "password", envOr("EMBCACHE_NATS_PASSWORD", ""), "its password ($EMBCACHE_NATS_PASSWORD)")
	f.StringVar(&c.tlsCert, "tls-cert", "", "NATS client TLS certificate (PEM)")
	f.StringVar(&c.tlsKey, "tls-key", "", "NATS client TLS key (PEM)")
	f.StringVar(&c.tlsCA, "tls-ca", "", "CA to verify NATS clients with (mutual TLS)")
	f.StringVar(&c.natsConfig, "nats-config", "", "a nats-server configuration file (accounts, permissions); flags override it")
	f.BoolVar(&c.noSync, "no-sync", false, "turn JetStream SyncAlways off (faster, loses acknowledged writes on a crash)")
	f.BoolVar(&c.noNATS, "no-nats", false, "do not embed NATS; join --nats")
	f.StringVar(&c.joinURL, "nats", "", "join this NATS instead of embedding one (implies --no-nats)")
	f.BoolVar(&c.noReconciler, "no-reconciler", false, "do not run a reconciler on this node")
	f.IntVar(&c.replicas, "replicas", 1, "replicas of the bucket and stream (3 in a cluster)")
	f.StringVar(&c.shmDir, "shm-dir", shm.DefaultDir, "this node's shared-memory payload directory")
	f.StringVar(&c.node, "node", hostname(), "this node's name")
	f.StringVar(&c.httpListen, "http-listen", "", "serve this node's payloads over HTTP on this address")
	f.StringVar(&c.token, "payload-token", envOr("EMBCACHE_PAYLOAD_TOKEN", ""), "bearer token for payload pulls")
	f.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	f.DurationVar(&c.leaseTTL, "lease-ttl", 5*time.Second, "lease TTL (also the reconciler election's)")
	f.DurationVar(&c.storeTTL, "store-ttl", time.Hour, "committed record TTL")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "log more (and the NATS server's log)")
	return cmd
}

func runServe(ctx context.Context, c serveConfig, cmd *cobra.Command) error {
	logger := newLogger(cmd.ErrOrStderr(), c.verbose)
	out := cmd.OutOrStdout()
	url := c.joinURL
	var natsOpts []nats.Option
	if c.user != "" {
		natsOpts = append(natsOpts, nats.UserInfo(c.user, c.pass))
	}
	if url == "" && !c.noNATS {
		opts := embedded.Options{StoreDir: c.storeDir, Name: c.name, Host: c.host, Port: c.port, NoSync: c.noSync,
			Username: c.user, Password: c.pass, Logs: c.verbose}
		if c.clusterPort != 0 {
			opts.ClusterName, opts.ClusterHost, opts.ClusterPort = c.clusterName, c.host, c.clusterPort
			if c.routes != "" {
				opts.Routes = strings.Split(c.routes, ",")
			}
		}
		if c.natsConfig != "" || c.tlsCert != "" {
			opts.Configure = func(o *server.Options) error { return configureServer(o, c) }
		}
		srv, err := embedded.Start(opts)
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url = srv.ClientURL()
		if c.tlsCert != "" {
			url = strings.Replace(url, "nats://", "tls://", 1)
			tc, err := clientTLS(c)
			if err != nil {
				return err
			}
			natsOpts = append(natsOpts, nats.Secure(tc))
		}
		fmt.Fprintf(out, "embcache serve: NATS (JetStream, %s) listening at %s\n", c.storeDir, url)
	} else if url == "" {
		return usagef("--no-nats needs --nats URL")
	}

	nc, err := coordinator.Connect(url, coordinator.ModeDegrade, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = events.EnsureStream(ectx, js, c.replicas)
	cancel()
	if err != nil {
		logger.Warn("event stream not ready yet; the reconciler will retry", "err", err)
	}

	store, err := shm.Open(c.shmDir, shm.WithNode(c.node))
	if err != nil {
		return err
	}
	tel, err := startTelemetry(ctx, "embcache-serve", c.metricsListen)
	if err != nil {
		return err
	}
	defer tel.shutdown()
	if tel.addr != "" {
		fmt.Fprintf(out, "embcache serve: metrics at http://%s/metrics\n", tel.addr)
	}
	if c.httpListen != "" {
		l, err := net.Listen("tcp", c.httpListen)
		if err != nil {
			return err
		}
		var sopts []httppull.ServerOption
		if c.token != "" {
			sopts = append(sopts, httppull.WithServerToken(c.token))
		}
		hs := &http.Server{Handler: httppull.NewServer(store, append(sopts, httppull.WithLogger(logger))...), ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(l)
		defer hs.Shutdown(context.Background())
		fmt.Fprintf(out, "embcache serve: payloads at http://%s%s\n", l.Addr(), httppull.PathPrefix)
	}
	done := make(chan struct{})
	if !c.noReconciler {
		rec, err := coordinator.NewReconciler(nc, append(tel.options(), coordinator.WithNode(c.node), coordinator.WithReplicas(c.replicas),
			coordinator.WithLeaseTTL(c.leaseTTL), coordinator.WithStoreTTL(c.storeTTL), coordinator.WithLogger(logger),
			coordinator.WithTransport(payload.TransportShm, store))...)
		if err != nil {
			return err
		}
		go func() { rec.Run(ctx); close(done) }()
		fmt.Fprintln(out, "embcache serve: reconciler campaigning")
	} else {
		close(done)
	}
	fmt.Fprintln(out, "embcache serve: ready (Ctrl-C to stop)")
	<-ctx.Done()
	<-done
	fmt.Fprintln(out, "embcache serve: stopped")
	return nil
}

// configureServer applies a nats-server config file and TLS flags.
func configureServer(o *server.Options, c serveConfig) error {
	if c.natsConfig != "" {
		fromFile, err := server.ProcessConfigFile(c.natsConfig)
		if err != nil {
			return usagef("--nats-config: %v", err)
		}
		// The file brings accounts, users and permissions; flags keep the rest.
		o.Accounts, o.Users, o.Nkeys, o.SystemAccount = fromFile.Accounts, fromFile.Users, fromFile.Nkeys, fromFile.SystemAccount
		o.NoAuthUser = fromFile.NoAuthUser
		if fromFile.TLSConfig != nil {
			o.TLSConfig = fromFile.TLSConfig
		}
	}
	if c.tlsCert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: c.tlsCert, KeyFile: c.tlsKey, CaFile: c.tlsCA, Verify: c.tlsCA != ""})
		if err != nil {
			return usagef("TLS: %v", err)
		}
		o.TLSConfig, o.TLS = tc, true
		o.TLSVerify = c.tlsCA != ""
	}
	return nil
}

// clientTLS is how this process's own connection trusts the embedded server.
func clientTLS(c serveConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("--tls-ca holds no certificate")
		}
		tc.RootCAs = pool
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	} else {
		// No CA: trust the server's own (self-signed) certificate.
		pem, err := os.ReadFile(c.tlsCert)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("--tls-cert holds no certificate")
		}
		tc.RootCAs = pool
	}
	return tc, nil
}
