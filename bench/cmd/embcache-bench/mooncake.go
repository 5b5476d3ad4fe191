package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/embcache/embcache/embedded"
)

// The workload's embcache-r1-mooncake system: embcache R1 whose processes
// write and read values through a real Mooncake Store (TCP transport over
// loopback) instead of pulling them from each other's HTTP servers. The
// bench runs the store's mooncake_master, as it runs redis-server; each
// worker process contributes a segment (the node.MooncakeOptions default,
// 512 MiB) for the whole run, as each one of the other systems serves its
// own values: a process stands for a node here, and the segment is its
// long-lived process's (docs/operations.md, Mooncake).

// mooncakeDirEnv are where a Mooncake install is looked for
// (lib/libmooncake_store.so, bin/mooncake_master), as the tests look.
var mooncakeDirEnv = []string{"EMBCACHE_MOONCAKE_DIR", "MOONCAKE_DIR"}

func defaultMooncakeDir() string {
	for _, env := range mooncakeDirEnv {
		if dir := os.Getenv(env); dir != "" {
			return dir
		}
	}
	return ""
}

// mooncakeConfig is how a worker reaches the store.
type mooncakeConfig struct {
	Library  string `json:"library"`
	Master   string `json:"master"`   // host:port of the master's RPC
	Metadata string `json:"metadata"` // its HTTP metadata server's URL
}

// errNoMooncake: the system cannot run in this binary or without a store;
// the row says why instead.
var errNoMooncake = errors.New("no Mooncake")

// mooncakeSkip says why the mooncake system cannot run here, or "".
func mooncakeSkip(dir string) string {
	if !mooncakeBuilt {
		return "not in this binary: make build-bench-mooncake builds bin/embcache-bench-mooncake (cgo, -tags mooncake)"
	}
	if dir == "" {
		return "no Mooncake Store: --mooncake-dir, $EMBCACHE_MOONCAKE_DIR or $MOONCAKE_DIR (make mooncake unpacks one into build/mooncake)"
	}
	return ""
}

// startMooncakeMaster runs dir's mooncake_master on free loopback ports
// (its RPC, HTTP metadata server and metrics), and waits until it answers.
func startMooncakeMaster(dir string) (cfg mooncakeConfig, pid int, stop func(), err error) {
	lib := filepath.Join(dir, "lib", "libmooncake_store.so")
	if _, err := os.Stat(lib); err != nil {
		return cfg, 0, nil, fmt.Errorf("%w: %w", errNoMooncake, err)
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = embedded.FreePort("127.0.0.1"); err != nil {
			return cfg, 0, nil, err
		}
	}
	rpc, meta, metrics := ports[0], ports[1], ports[2]
	var log bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "bin", "mooncake_master"),
		"--enable_http_metadata_server=true", "--http_metadata_server_port="+strconv.Itoa(meta),
		"--rpc_port="+strconv.Itoa(rpc), "--metrics_port="+strconv.Itoa(metrics))
	cmd.Env = append(os.Environ(), "GLOG_logtostderr=1")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return cfg, 0, nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	cfg = mooncakeConfig{Library: lib, Master: net.JoinHostPort("127.0.0.1", strconv.Itoa(rpc)),
		Metadata: fmt.Sprintf("http://127.0.0.1:%d/metadata", meta)}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{cfg.Master, net.JoinHostPort("127.0.0.1", strconv.Itoa(meta))} {
		for {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				stop()
				return cfg, 0, nil, fmt.Errorf("mooncake_master not answering on %s: %v; its log: %s", addr, err, tail(log.String(), 2000))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cfg, cmd.Process.Pid, stop, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
