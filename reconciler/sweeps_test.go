package reconciler_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/reconciler"
)

// countingHandler counts log records whose message contains sub.
type countingHandler struct {
	sub string
	n   *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// One record this release cannot decode (a newer release's record
// version in a rolling upgrade, or a forged write) makes every sweep
// "unfinished": the tracker keeps the sweep owed and starts it again at
// every mark, forever, and writes sweeping=true so every successor
// sweeps forever too.
func TestHuntABadRecordMakesSweepsRepeatForever(t *testing.T) {
	e := newWorld(t)
	e.commit(0, time.Hour)
	body := []byte(`{"v":99,"owner":"newer/1","state":"committed"}`)
	if _, err := e.b.Shards()[0].Put(context.Background(), lease.ValueKey(tenant, keyOf(0)), body); err != nil {
		t.Fatal(err)
	}
	var unsettled atomic.Int64
	log := slog.New(countingHandler{sub: "sweep left values unsettled", n: &unsettled})
	r, _ := e.reconciler(e.store, reconciler.WithLogger(log))
	waitFor(t, "active", func() bool { return r.Stats().Active })
	time.Sleep(6 * time.Second)
	if n := unsettled.Load(); n > 2 {
		_, sweeping, _ := e.progressOf()
		t.Fatalf("%d sweeps in 6 s left the undecodable record unsettled and were started again (sweeps finished: %d, record sweeping=%v)",
			n, r.Stats().Sweeps, sweeping)
	}
}

// A value whose record expired with no reconciler running (its marker
// before the term's start: only a sweep finds it), and whose key is being
// computed again when the sweep reads it (a live computing record), is
// announced by the sweep, its payload left to the new compute. (The sweep
// took any live record for the value's.)
func TestASweepAnnouncesAValueWhoseKeyIsComputedAgain(t *testing.T) {
	e := newWorld(t)
	ctx := context.Background()
	loc := e.commit(0, time.Second)
	waitFor(t, "value 0's record expired", func() bool { return !e.record(0).Live })
	now := time.Now()
	computing := lease.Record{V: lease.RecordVersion, State: lease.StateComputing, Owner: "w2/1/x", Nonce: "y", Started: now, Heartbeat: now}
	if _, err := e.b.Create(ctx, lease.ValueKey(tenant, keyOf(0)), computing, time.Minute); err != nil {
		t.Fatal(err)
	}
	r, _ := e.reconciler(e.store)
	waitFor(t, "the term's sweep done", func() bool { return r.Stats().Sweeps == 1 })
	if !e.evicted(0) {
		t.Fatal("the expired value's eviction was not announced")
	}
	if _, err := e.store.Get(ctx, loc); err != nil {
		t.Fatalf("the payload, which the new compute may put again under its name, was deleted: %v", err)
	}
}

// A successor that starts from a progress mark more than half a marker
// TTL old sweeps: markers placed just after the mark may be removed by
// the server before its consumer is handed them. (It swept only past a
// whole marker TTL.)
func TestASuccessorFromAnOldMarkSweeps(t *testing.T) {
	e := newWorld(t)
	old, err := json.Marshal(map[string]any{"v": 1, "owner": "gone", "handled": time.Now().Add(-40 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Shards()[0].Create(context.Background(), reconciler.ProgressKey, old); err != nil {
		t.Fatal(err)
	}
	r, _ := e.reconciler(e.store) // the marker TTL of a minute
	waitFor(t, "the successor's sweep", func() bool { return r.Stats().Sweeps == 1 })
}
