// Package mooncakemaster runs a Mooncake Store's mooncake_master on free
// loopback ports: the one the real-Mooncake tests use
// (internal/mooncaketest) and the one the bench workload runs, as it runs
// redis-server.
package mooncakemaster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/embcache/embcache/embedded"
)

// DirEnv are the variables that name a Mooncake install
// (lib/libmooncake_store.so, bin/mooncake_master), first first: the bundle
// make mooncake unpacks, then a user's own.
var DirEnv = []string{"EMBCACHE_MOONCAKE_DIR", "MOONCAKE_DIR"}

// Library is the store's C library in dir.
func Library(dir string) string { return filepath.Join(dir, "lib", "libmooncake_store.so") }

// startWait is how long a started master has to answer on its ports;
// stopWait how long a signalled one has to exit before it is killed.
const (
	startWait = 20 * time.Second
	stopWait  = 10 * time.Second
)

// Master is a mooncake_master on loopback ports chosen by New. Start runs
// it; Stop ends it; Start runs it again on the same ports. Its methods are
// not safe for concurrent use.
type Master struct {
	Addr     string // host:port of its RPC
	Metadata string // its HTTP metadata server's URL
	Metrics  string // its Prometheus metrics' URL

	bin  string
	args []string
	meta string        // host:port of the metadata server
	cmd  *exec.Cmd     // the running master, or nil
	log  *bytes.Buffer // its output; read only once it has exited
}

// New returns a stopped master of dir's bin/mooncake_master, on free
// loopback ports, with flags added to the ones that set its ports.
func New(dir string, flags ...string) (*Master, error) {
	var ports [3]int
	for i := range ports {
		p, err := embedded.FreePort("127.0.0.1")
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	rpc, meta, metrics := ports[0], ports[1], ports[2]
	m := &Master{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(rpc)),
		Metadata: fmt.Sprintf("http://127.0.0.1:%d/metadata", meta),
		Metrics:  fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics),
		bin:      filepath.Join(dir, "bin", "mooncake_master"),
		meta:     net.JoinHostPort("127.0.0.1", strconv.Itoa(meta))}
	m.args = append([]string{"--enable_http_metadata_server=true", "--http_metadata_server_port=" + strconv.Itoa(meta),
		"--rpc_port=" + strconv.Itoa(rpc), "--metrics_port=" + strconv.Itoa(metrics)}, flags...)
	return m, nil
}

// Start runs the master and waits until its RPC and metadata server
// answer. If they do not within 20 s, it stops the master and returns an
// error that carries the end of its log.
func (m *Master) Start() error {
	if m.cmd != nil {
		return errors.New("mooncakemaster: Start of a running master")
	}
	m.log = new(bytes.Buffer)
	m.cmd = exec.Command(m.bin, m.args...)
	m.cmd.Env = append(os.Environ(), "GLOG_logtostderr=1")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		m.cmd = nil
		return fmt.Errorf("mooncakemaster: %w", err)
	}
	deadline := time.Now().Add(startWait)
	for _, addr := range []string{m.Addr, m.meta} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				log := m.Stop(syscall.SIGKILL)
				return fmt.Errorf("mooncakemaster: mooncake_master not answering on %s: %w; its log: %s", addr, err, Tail(log, 2000))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// Running reports whether the master runs (Start, not Stop, was the last
// call that succeeded).
func (m *Master) Running() bool { return m.cmd != nil }

// Pid is the running master's process ID, or 0.
func (m *Master) Pid() int {
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Stop sends the running master sig, kills it if it has not exited within
// 10 s, waits for it and returns its log. With no master running it
// returns "".
func (m *Master) Stop(sig syscall.Signal) string {
	if m.cmd == nil {
		return ""
	}
	m.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { m.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopWait):
		m.cmd.Process.Kill()
		<-done
	}
	log := m.log.String()
	m.cmd, m.log = nil, nil
	return log
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
