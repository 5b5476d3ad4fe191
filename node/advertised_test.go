package node_test

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/embcache/embcache/node"
)

// TestAnAdvertisedServerOfAnotherDirectoryIsSaid: a node that advertises
// another process's pull server (an agent beside its serve) checks that
// the server serves its shm directory. With a directory of its own (a
// second new user's trial gave the agent one), other nodes could read
// none of its values, silently: now an error says so; with the server's
// directory, nothing is said.
func TestAnAdvertisedServerOfAnotherDirectoryIsSaid(t *testing.T) {
	srv := startServer(t)
	shared := filepath.Join(t.TempDir(), "shm")
	serve := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n1", ShmDir: shared, NoEvents: true,
		PayloadListen: "127.0.0.1:0"})
	const warning, fine = "does not serve this node's shm directory", "serves this node's shm directory"
	for _, c := range []struct {
		dir   string
		wrong bool
	}{{filepath.Join(t.TempDir(), "own"), true}, {shared, false}} {
		log := &syncbuf.Buffer{}
		n := startNode(t, node.Options{NATSURL: srv.ClientURL(), Name: "n1", ShmDir: c.dir, NoEvents: true,
			Advertise: "http://" + serve.PayloadAddr(),
			Logger:    slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(log.String(), warning) && !strings.Contains(log.String(), fine) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // the check's answer, either way
		}
		n.Close() // waits for the check: what it said is in the log now
		if got := strings.Contains(log.String(), warning); got != c.wrong {
			t.Fatalf("shm dir %s: said %v, want %v:\n%s", c.dir, got, c.wrong, log.String())
		}
	}
}
