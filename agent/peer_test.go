package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/internal/localdir/localdirtest"
)

// A process of another user listening where the agent's socket should be
// (the agent not started, or refused to start) gets nothing: the client's
// calls fail naming it, before a byte is sent. Trusted by WithAgentUID,
// it is called.
func TestAClientRefusesAProcessOfAnotherUserOnTheSocket(t *testing.T) {
	dir := filepath.Join(localdirtest.Dir(t), "run") // the other user made it first
	localdirtest.Squat(t, dir, 0o755)
	socket := filepath.Join(dir, "agent.sock")
	localdirtest.ServeAs(t, localdirtest.Nobody, localdirtest.Nobody, socket)
	ctx := context.Background()

	c := agent.Dial(socket)
	defer c.Close()
	if _, err := c.Stats(ctx); !errors.Is(err, agent.ErrUntrustedAgent) || !strings.Contains(err.Error(), socket) {
		t.Fatalf("stats from uid %d's process: %v, want ErrUntrustedAgent naming the socket", localdirtest.Nobody, err)
	}

	trusting := agent.Dial(socket, agent.WithAgentUID(localdirtest.Nobody))
	defer trusting.Close()
	if _, err := trusting.Stats(ctx); err != nil {
		t.Fatalf("stats from a trusted uid's process: %v", err)
	}
}
