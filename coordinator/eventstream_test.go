package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/payload"
	"github.com/nats-io/nats.go/jetstream"
)

// logCounter counts log records whose message contains sub.
type logCounter struct {
	sub string
	n   *atomic.Int64
}

func (h logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h logCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logCounter) WithGroup(string) slog.Handler      { return h }

// A Cache that creates the event stream gives it its limit
// (WithEventsMaxBytes); one that finds it with another leaves it and says
// so. (The stream was 1 GiB whatever the cluster: issue 33, item 9.)
func TestACacheCreatesTheEventStreamWithItsLimit(t *testing.T) {
	srv := startServer(t)
	store := payload.NewMemoryStore("test-node", 0)
	eventCache(t, srv.ClientURL(), store, WithEventsMaxBytes(2<<20))
	js, err := jetstream.New(connect(t, srv.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	maxBytes := func() int64 {
		s, err := js.Stream(context.Background(), events.StreamName)
		if err != nil {
			return 0
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return 0
		}
		return info.Config.MaxBytes
	}
	waitFor(t, func() bool { return maxBytes() == 2<<20 })
	var warned atomic.Int64
	log := slog.New(logCounter{sub: "limit is not this process's", n: &warned})
	c := eventCache(t, srv.ClientURL(), store, WithEventsMaxBytes(4<<20), WithLogger(log))
	waitFor(t, func() bool { return c.eventLink() != nil })
	if got := maxBytes(); got != 2<<20 {
		t.Fatalf("a worker changed the stream's limit to %d", got)
	}
	if warned.Load() != 1 {
		t.Fatalf("%d warnings that the stream holds another limit, want 1", warned.Load())
	}
}

// A limit out of range is refused, naming it.
func TestWithEventsMaxBytesRefusesBadValues(t *testing.T) {
	for _, n := range []int64{-1, 1000, events.MinMaxBytes - 1} {
		_, err := New(context.Background(), connect(t, startServer(t).ClientURL()), WithEventsMaxBytes(n))
		if !errors.Is(err, ErrInvalidOption) || !errors.Is(err, events.ErrInvalidStreamConfig) || !strings.Contains(err.Error(), "max bytes") {
			t.Errorf("%d: %v, want ErrInvalidOption naming max bytes", n, err)
		}
	}
}
