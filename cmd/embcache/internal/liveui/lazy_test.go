package liveui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/live"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func (l *Lazy) running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.agg != nil
}

// TestLazyListensOnlyWhileLookedAt: the first View starts the
// Aggregator, a spell without one stops it, the next starts it again,
// and Close stops it for good; the page and its JSON are served.
func TestLazyListensOnlyWhileLookedAt(t *testing.T) {
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	started := 0
	l := NewLazy(func() (*live.Aggregator, error) { started++; return live.NewAggregator(nc) }, 50*time.Millisecond)
	mux := http.NewServeMux()
	Register(mux, l)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct{ path, want string }{{"/", "<title>embcache live</title>"}, {"/api/live", `"totals":`}} {
		resp, err := srv.Client().Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		buf := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(b.String(), c.want) {
			t.Fatalf("GET %s: %s, no %q", c.path, resp.Status, c.want)
		}
	}
	if !l.running() || started != 1 {
		t.Fatal("a View did not start it")
	}
	for deadline := time.Now().Add(10 * time.Second); l.running(); {
		if time.Now().After(deadline) {
			t.Fatal("still listening long after the last View")
		}
		time.Sleep(10 * time.Millisecond) // polling its goroutine
	}
	l.View()
	if !l.running() || started != 2 {
		t.Fatal("the next View did not start it again")
	}
	l.Close()
	if l.View(); l.running() || started != 2 {
		t.Fatal("running after Close")
	}
}
