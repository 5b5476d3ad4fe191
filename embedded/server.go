package embedded

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/internal/dirlock"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNotReady is returned when a server does not accept connections in time.
var ErrNotReady = errors.New("embedded: server not ready")

// ErrPortInUse is returned when a node's client or route port is taken
// (by another process, or by another node of this one) as it starts.
var ErrPortInUse = errors.New("embedded: port in use")

// ErrStoreDirInUse is returned when another running server (of this
// process or another) holds the node's StoreDir: two servers on one store
// both started and wrote the same streams' files.
var ErrStoreDirInUse = errors.New("embedded: store directory in use")

// Options configures one node. The zero value (plus a StoreDir) is a
// single loopback node on a free port with SyncAlways.
type Options struct {
	StoreDir string // JetStream files; required
	Name     string // server name, unique in a cluster; default "embcache-<port>"
	Host     string // client listen host; default 127.0.0.1
	Port     int    // client port; 0 picks a free one (kept across Restart)

	// NoSync turns SyncAlways off: faster, and an acknowledged write can be
	// lost if the machine crashes.
	NoSync bool

	// Cluster settings; ClusterPort 0 means a standalone server.
	ClusterName string
	ClusterHost string // default 127.0.0.1
	ClusterPort int
	Routes      []string // nats-route://host:port of the other nodes

	// Username and Password, when set, are required of every client.
	Username, Password string

	// TLSCert and TLSKey, when set, make clients connect with TLS
	// (ClientURL is then tls://...; ClientTLS is a client's config).
	// TLSCA, when set too, requires client certificates it signed.
	TLSCert, TLSKey, TLSCA string

	// ConfigFile is a nats-server configuration file whose accounts,
	// users, permissions and TLS apply; the fields above keep the rest.
	ConfigFile string

	// Configure, if set, edits the server options last (accounts,
	// permissions): the escape hatch for what this struct does not say.
	Configure func(*server.Options) error

	// Logs sends the server's log to stderr.
	Logs bool

	ReadyTimeout time.Duration // default 10s
}

// Server is a running (or stopped) embedded node.
type Server struct {
	opts Options

	mu   sync.Mutex
	srv  *server.Server // nil while stopped; guarded by mu
	lock *os.File       // StoreDir, flock(2)ed while running; guarded by mu
}

// Start starts a node and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("embedded: StoreDir is required")
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.ClusterHost == "" {
		opts.ClusterHost = "127.0.0.1"
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 10 * time.Second
	}
	if opts.Port == 0 {
		p, err := FreePort(opts.Host)
		if err != nil {
			return nil, err
		}
		opts.Port = p
	}
	if opts.Name == "" {
		opts.Name = "embcache-" + strconv.Itoa(opts.Port)
	}
	s := &Server{opts: opts}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) serverOptions() (*server.Options, error) {
	o := &server.Options{
		ServerName:         s.opts.Name,
		Host:               s.opts.Host,
		Port:               s.opts.Port,
		JetStream:          true,
		StoreDir:           s.opts.StoreDir,
		SyncAlways:         !s.opts.NoSync,
		NoSigs:             true,
		NoLog:              !s.opts.Logs,
		Username:           s.opts.Username,
		Password:           s.opts.Password,
		MaxPayload:         8 << 20,
		JetStreamMaxMemory: 256 << 20,
	}
	if s.opts.ClusterPort != 0 {
		o.Cluster = server.ClusterOpts{Name: s.opts.ClusterName, Host: s.opts.ClusterHost, Port: s.opts.ClusterPort}
		for _, r := range s.opts.Routes {
			o.Routes = append(o.Routes, server.RoutesFromStr(r)...)
		}
	}
	if err := s.applyFiles(o); err != nil {
		return nil, err
	}
	if s.opts.Configure != nil {
		if err := s.opts.Configure(o); err != nil {
			return nil, fmt.Errorf("embedded: configure: %w", err)
		}
	}
	return o, nil
}

func (s *Server) start() error {
	o, err := s.serverOptions()
	if err != nil {
		return err
	}
	// A taken port would cost the whole ReadyTimeout (the server keeps
	// waiting for a listener that never comes): say so at once instead.
	if err := s.checkPorts(); err != nil {
		return err
	}
	lock, err := lockStoreDir(s.opts.StoreDir)
	if err != nil {
		return err
	}
	srv, err := server.NewServer(o)
	if err != nil {
		lock.Close()
		return fmt.Errorf("embedded: %w", err)
	}
	why := &fatalLog{}
	if s.opts.Logs {
		srv.ConfigureLogger()
	} else {
		srv.SetLogger(why, false, false)
	}
	srv.Start()
	if !srv.ReadyForConnections(s.opts.ReadyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		lock.Close()
		return fmt.Errorf("%w: %s after %v%s", ErrNotReady, s.ClientURL(), s.opts.ReadyTimeout, why.String())
	}
	s.mu.Lock()
	s.srv, s.lock = srv, lock
	s.mu.Unlock()
	return nil
}

// fatalLog is the server's logger while its log is off (Options.Logs): it
// keeps the first fatal error, why a server that never became ready
// stopped (a ConfigFile whose accounts' JetStream limits exceed the
// server's: "insufficient memory resources available"), which would
// otherwise be lost with the log.
type fatalLog struct {
	mu    sync.Mutex
	fatal string // guarded by mu
}

func (l *fatalLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		l.fatal = fmt.Sprintf(format, v...)
	}
}

// String is ": <the fatal error>", or "" if there was none.
func (l *fatalLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		return ""
	}
	return ": " + l.fatal
}

func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

var _ server.Logger = (*fatalLog)(nil)

// lockStoreDir makes dir if need be and takes its lock, or fails at once
// with ErrStoreDirInUse.
func lockStoreDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: store directory: %w", err)
	}
	f, err := dirlock.Lock(dir)
	if errors.Is(err, dirlock.ErrHeld) {
		return nil, fmt.Errorf("%w: %s is another running server's", ErrStoreDirInUse, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded: store directory: %w", err)
	}
	return f, nil
}

// checkPorts fails with ErrPortInUse when the client or route port cannot
// be bound right now.
func (s *Server) checkPorts() error {
	ports := []int{s.opts.Port}
	if s.opts.ClusterPort != 0 {
		ports = append(ports, s.opts.ClusterPort)
	}
	hosts := []string{s.opts.Host, s.opts.ClusterHost}
	for i, port := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[i], strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("%w: %s:%d: %w", ErrPortInUse, hosts[i], port, err)
		}
		l.Close()
	}
	return nil
}

// ClientURL is the URL clients connect to (tls:// with TLSCert).
func (s *Server) ClientURL() string {
	scheme := "nats://"
	if s.opts.TLSCert != "" {
		scheme = "tls://"
	}
	return scheme + net.JoinHostPort(s.opts.Host, strconv.Itoa(s.opts.Port))
}

// Name returns the server name.
func (s *Server) Name() string { return s.opts.Name }

// NATS returns the running server, or nil while stopped.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Running reports whether the node is up.
func (s *Server) Running() bool { return s.NATS() != nil }

// Connect returns a client connection to this node. Options are appended
// to the defaults (a name, reconnects forever with a short wait, the
// node's credentials and ClientTLS).
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.Name("embcache-embedded-client"), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if s.opts.Username != "" {
		base = append(base, nats.UserInfo(s.opts.Username, s.opts.Password))
	}
	tc, err := s.ClientTLS()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		base = append(base, nats.Secure(tc))
	}
	return nats.Connect(s.ClientURL(), append(base, opts...)...)
}

// Shutdown stops the node and waits until it is down. The store stays on
// disk for Restart. It is safe to call on a stopped node.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv, lock := s.srv, s.lock
	s.srv, s.lock = nil, nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
	if lock != nil {
		lock.Close() // after the server's files are closed
	}
}

// Restart starts a stopped node again with the same options, ports and store.
func (s *Server) Restart() error {
	if s.Running() {
		return errors.New("embedded: restart of a running server")
	}
	return s.start()
}

// FreePort returns a TCP port on host that was free a moment ago.
//
// It looks outside the kernel's ephemeral range where it knows it (Linux),
// so that no outgoing connection can be given the port of a node that is
// stopped for a Restart, and it walks that range from a random start, so
// that the nodes of one process never get a port another of its nodes had
// (until the walk wraps around). Elsewhere it asks the kernel for one.
func FreePort(host string) (int, error) {
	if p, ok := ports.next(host); ok {
		return p, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("embedded: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ports hands out the ports FreePort returns.
var ports = newPortWalk("/proc/sys/net/ipv4/ip_local_port_range")

// portWalk walks a range of ports outside the ephemeral one, one port
// after the other; a port is handed out only if it can be bound.
type portWalk struct {
	lo, hi int // [lo, hi); empty: the range is unknown

	mu     sync.Mutex
	cursor int // guarded by mu
}

// The lowest port handed out: below it live the well-known services.
const minPort = 10000

// newPortWalk reads the ephemeral range ("lo hi") from file and walks the
// ports below it (or, when those are too few, above it).
func newPortWalk(file string) *portWalk {
	w := &portWalk{}
	raw, err := os.ReadFile(file)
	if err != nil {
		return w
	}
	f := strings.Fields(string(raw))
	if len(f) != 2 {
		return w
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo > hi {
		return w
	}
	const enough = 1000
	switch {
	case lo-minPort >= enough:
		w.lo, w.hi = minPort, lo
	case 65536-(hi+1) >= enough:
		w.lo, w.hi = hi+1, 65536
	default:
		return w
	}
	w.cursor = w.lo + rand.IntN(w.hi-w.lo) // another process walks from elsewhere
	return w
}

// next returns the next port of the walk that host:port can bind now;
// false when the range is unknown or no port of it is free.
func (w *portWalk) next(host string) (int, bool) {
	if w.hi <= w.lo {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for range w.hi - w.lo {
		p := w.cursor
		if w.cursor++; w.cursor == w.hi {
			w.cursor = w.lo
		}
		if l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p))); err == nil {
			l.Close()
			return p, true
		}
	}
	return 0, false
}
