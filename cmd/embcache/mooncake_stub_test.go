//go:build !(mooncake && cgo)

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestPayloadMooncakeNeedsTheTag: this binary is built without -tags
// mooncake, so asking for the transport is a usage error that says how to
// get it, before anything connects or listens (serve starts no NATS).
func TestPayloadMooncakeNeedsTheTag(t *testing.T) {
	for _, cmd := range []string{"worker", "agent", "serve"} {
		args := []string{cmd, "--payload", "mooncake", "--mooncake-master", "127.0.0.1:50051", "--shm-dir", t.TempDir()}
		switch cmd {
		case "agent":
			args = append(args, "--socket", filepath.Join(t.TempDir(), "agent.sock"), "--nats", "nats://127.0.0.1:1")
		case "worker":
			args = append(args, "--nats", "nats://127.0.0.1:1")
		case "serve": // embedded NATS: refused before it would start
			args = append(args, "--port", "1", "--store-dir", t.TempDir())
		}
		stdout, stderr, code := run(t, args...)
		if code != 2 || !strings.Contains(stderr, "-tags mooncake") || strings.Contains(stdout, "NATS") {
			t.Errorf("%s --payload mooncake: exit %d, want 2 naming the tag\n%s%s", cmd, code, stdout, stderr)
		}
	}
	if _, stderr, code := run(t, "worker", "--payload", "http", "--nats", "nats://127.0.0.1:1", "--shm-dir", t.TempDir()); code != 2 ||
		!strings.Contains(stderr, "listen address") {
		t.Errorf("--payload http without --payload-listen: exit %d, want 2\n%s", code, stderr)
	}
}
