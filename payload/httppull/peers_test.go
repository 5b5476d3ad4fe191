package httppull

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/embcache/embcache/payload"
)

// recorder is a pull server that notes every request's Authorization
// header: a hostile tenant's, serving a copy of a value under its own
// address.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string // the Authorization header of each request, in order
}

func newRecorder(t *testing.T, src Source) *recorder {
	r := &recorder{}
	h := newServer(t, src)
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	t.Cleanup(r.Client().CloseIdleConnections)
	return r
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auth...)
}

// TestTokenGoesOnlyToPeers: a record names a hostile server that holds a
// good copy of the value. A puller with a token and peers pulls from its
// peer, and refuses the hostile address without a request (the server
// sees nothing, so no token); one with a token and no peers refuses every
// address but its own; one with neither pulls from anywhere, token-less.
func TestTokenGoesOnlyToPeers(t *testing.T) {
	ctx := context.Background()
	a := newNode(t, "a", false, "s3cret")
	v := value(1 << 16)
	loc, err := a.transport.Put(ctx, testObj, v)
	if err != nil {
		t.Fatal(err)
	}
	hostileStore := payload.NewMemoryStore("hostile", 0)
	if _, err := hostileStore.Put(ctx, testObj, v); err != nil {
		t.Fatal(err)
	}
	hostile := newRecorder(t, hostileStore)
	planted := loc
	planted.Address, planted.Node = hostile.URL, "hostile"

	puller := func(opts ...Option) *Reader {
		t.Helper()
		r, err := NewReader(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.t.client.CloseIdleConnections)
		return r
	}
	refused := func(what string, err error, hint string) {
		t.Helper()
		if !errors.Is(err, payload.ErrUntrusted) || !strings.Contains(err.Error(), hostile.URL) || !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: %v, want payload.ErrUntrusted naming %s and saying %q", what, err, hostile.URL, hint)
		}
		if got := hostile.seen(); len(got) != 0 {
			t.Fatalf("%s: the hostile server got %d requests, Authorization %q", what, len(got), got)
		}
	}

	withPeers := puller(WithToken("s3cret"), WithPeers(strings.TrimPrefix(a.server.URL, "http://")))
	got, err := withPeers.Get(ctx, loc)
	if err != nil || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatalf("pull from the trusted peer: %v", err)
	}
	got.Close()
	_, err = withPeers.Get(ctx, planted)
	refused("token and peers, Get", err, "its peers are "+strings.TrimPrefix(a.server.URL, "http://"))
	_, err = withPeers.Stream(ctx, planted)
	refused("token and peers, Stream", err, "--payload-peers")

	noPeers := puller(WithToken("s3cret"))
	_, err = noPeers.Get(ctx, planted)
	refused("token without peers", err, "with a token and no peers named")
	if _, err := noPeers.Get(ctx, loc); !errors.Is(err, payload.ErrUntrusted) {
		t.Errorf("token without peers, from a server it was not told of: %v", err)
	}
	// A transport trusts its own address (the node's other processes'
	// values, served by its pull server).
	own, err := NewTransport("a2", a.server.URL, payload.NewMemoryStore("a2", 0), WithToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := own.Get(ctx, loc); err != nil {
		t.Errorf("a transport pulling from its own address: %v", err)
	} else {
		got.Close()
	}
	own.client.CloseIdleConnections()

	// Peers without a token restrict pulls all the same.
	_, err = puller(WithPeers(a.server.URL)).Get(ctx, planted)
	refused("peers without a token", err, "--payload-peers")

	// The control: the hostile server does serve the value, to a puller
	// that has no token to give.
	got, err = puller().Get(ctx, planted)
	if err != nil || !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
		t.Fatalf("open puller from the hostile server: %v", err)
	}
	got.Close()
	if seen := hostile.seen(); len(seen) != 1 || seen[0] != "" {
		t.Fatalf("the open puller sent Authorization %q", seen)
	}
}

// TestPeerAddresses: how a peer is named, and which Location addresses
// each name trusts.
func TestPeerAddresses(t *testing.T) {
	for _, bad := range []string{"", "host", "host:", ":80", "ftp://h:1", "http://h:1/path", "http://"} {
		if _, err := NewReader(WithPeers(bad)); !errors.Is(err, ErrBadPeer) {
			t.Errorf("peer %q: %v, want ErrBadPeer", bad, err)
		}
	}
	for _, c := range []struct {
		peer, address string
		trusted       bool
	}{
		{"h:7400", "http://h:7400", true},
		{"h:7400", "https://h:7400", true},
		{"H:7400", "http://h:7400", true},
		{"h:7400", "http://H:7400", true},
		{"h:7400", "http://h:7401", false},
		{"h:7400", "http://h2:7400", false},
		{"h:80", "http://h", true},
		{"https://h:7400", "https://h:7400", true},
		{"https://h:7400", "http://h:7400", false}, // not its token in clear
		{"http://h", "http://h:80", true},
		{"[::1]:7400", "http://[::1]:7400", true},
		{"10.0.0.5:7400", "http://10.0.0.5:7400", true},
		{"10.0.0.5:7400", "http://10.0.0.50:7400", false},
	} {
		r, err := NewReader(WithToken("tok"), WithPeers(c.peer))
		if err != nil {
			t.Fatalf("peer %q: %v", c.peer, err)
		}
		u, _ := url.Parse(c.address)
		if err := r.t.trust(u); (err == nil) != c.trusted {
			t.Errorf("peer %q, address %q: %v, want trusted %v", c.peer, c.address, err, c.trusted)
		}
	}
}
