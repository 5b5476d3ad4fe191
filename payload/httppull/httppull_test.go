package httppull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type node struct {
	name      string
	store     *payload.MemoryStore
	server    *httptest.Server
	token     string
	transport *Transport
}

// newNode serves a memory store (with token, if any) and pulls with a
// transport that trusts no other node yet (trusting).
func newNode(t *testing.T, name string, tlsOn bool, token string) *node {
	t.Helper()
	n := &node{name: name, store: payload.NewMemoryStore(name, 0), token: token}
	var sopts []ServerOption
	if token != "" {
		sopts = append(sopts, WithServerToken(token))
	}
	h := newServer(t, n.store, sopts...)
	if tlsOn {
		n.server = httptest.NewTLSServer(h)
	} else {
		n.server = httptest.NewServer(h)
	}
	t.Cleanup(n.server.Close)
	n.trusting(t)
	t.Cleanup(n.server.Client().CloseIdleConnections)
	return n
}

// trusting gives n a transport whose peers are others' servers.
func (n *node) trusting(t *testing.T, others ...*node) *node {
	t.Helper()
	opts := []Option{WithHTTPClient(n.server.Client())}
	if n.token != "" {
		opts = append(opts, WithToken(n.token))
	}
	for _, o := range others {
		opts = append(opts, WithPeers(o.server.URL))
	}
	tr, err := NewTransport(n.name, n.server.URL, n.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n.transport = tr
	return n
}

func value(n int) *payload.Value {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 13)
	}
	return payload.NewTensor(cachekey.Uint8, []int64{int64(n)}, data)
}

var testObj = payload.ObjectID{Tenant: "acme", Key: cachekey.Key{0xab, 0xcd}}

func TestPullAndServeOn(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		name := map[bool]string{false: "http", true: "https"}[tlsOn]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a, b, c := newNode(t, "a", tlsOn, "s3cret"), newNode(t, "b", tlsOn, "s3cret"), newNode(t, "c", tlsOn, "s3cret")
			b.trusting(t, a)
			c.trusting(t, b)
			v := value(3 << 20)
			loc, err := a.transport.Put(ctx, testObj, v)
			if err != nil {
				t.Fatal(err)
			}
			if loc.Transport != payload.TransportHTTP || loc.Address != a.server.URL || loc.Node != "a" {
				t.Fatalf("location %+v", loc)
			}
			got, err := b.transport.Get(ctx, loc)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Tensor.Data, v.Tensor.Data) {
				t.Fatal("pulled bytes differ")
			}
			// The replica that pulled serves it in turn.
			locB, err := b.transport.Put(ctx, testObj, got)
			if err != nil || locB.Checksum != loc.Checksum || locB.Address != b.server.URL {
				t.Fatalf("replica put: %+v %v", locB, err)
			}
			fromB, err := c.transport.Get(ctx, locB)
			if err != nil || !bytes.Equal(fromB.Tensor.Data, v.Tensor.Data) {
				t.Fatalf("pull from the replica: %v", err)
			}
			seen, err := a.transport.Generation(ctx, loc)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.transport.Delete(ctx, loc, seen); err != nil {
				t.Fatal(err)
			}
			if _, err := b.transport.Get(ctx, loc); !errors.Is(err, payload.ErrNotFound) {
				t.Fatalf("after delete: %v", err)
			}
		})
	}
}

func TestWrongTokenGets401AndNothingElse(t *testing.T) {
	ctx := context.Background()
	a := newNode(t, "a", false, "right")
	loc, _ := a.transport.Put(ctx, testObj, value(100))
	for _, auth := range []string{"", "Bearer wrong", "Bearer right-but-longer", "Basic cmlnaHQ=", "bearer right"} {
		req, _ := http.NewRequest(http.MethodGet, a.server.URL+PathPrefix+loc.Object, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := a.server.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || body.Len() != 0 ||
			resp.Header.Get(HeaderChecksum) != "" || resp.Header.Get(HeaderSize) != "" {
			t.Fatalf("auth %q: %s, %d body bytes, headers %v", auth, resp.Status, body.Len(), resp.Header)
		}
	}
	wrong, _ := NewTransport("b", "http://127.0.0.1:1", payload.NewMemoryStore("b", 0), WithToken("wrong"), WithPeers(a.server.URL))
	if _, err := wrong.Get(ctx, loc); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("transport with a wrong token: %v", err)
	}
}

// TestTenantTokens: a tenant's token pulls that tenant's objects and gets
// 401, and nothing else, for any other tenant's.
func TestTenantTokens(t *testing.T) {
	ctx := context.Background()
	store := payload.NewMemoryStore("a", 0)
	srv := httptest.NewServer(newServer(t, store, WithTenantToken("acme", "acme-token"), WithTenantToken("beta", "beta-token")))
	defer srv.Close()
	acmeObj := payload.ObjectID{Tenant: "acme", Key: cachekey.Key{1}}
	betaObj := payload.ObjectID{Tenant: "beta", Key: cachekey.Key{2}}
	owner, _ := NewTransport("a", srv.URL, store)
	acmeLoc, _ := owner.Put(ctx, acmeObj, value(100))
	betaLoc, _ := owner.Put(ctx, betaObj, value(100))
	acme, _ := NewTransport("x", "http://127.0.0.1:1", payload.NewMemoryStore("x", 0), WithToken("acme-token"), WithPeers(srv.URL))
	if _, err := acme.Get(ctx, acmeLoc); err != nil {
		t.Fatalf("acme pulling its own object: %v", err)
	}
	if _, err := acme.Get(ctx, betaLoc); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("acme pulling beta's object: %v", err)
	}
	beta, _ := NewTransport("x", "http://127.0.0.1:1", payload.NewMemoryStore("x", 0), WithToken("beta-token"), WithPeers(srv.URL))
	if _, err := beta.Get(ctx, acmeLoc); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("beta pulling acme's object: %v", err)
	}
	srv.Client().CloseIdleConnections()
	acme.client.CloseIdleConnections()
	beta.client.CloseIdleConnections()
}

func TestMalformedAndTraversalPaths(t *testing.T) {
	a := newNode(t, "a", false, "")
	loc, _ := a.transport.Put(context.Background(), testObj, value(100))
	key := testObj.Key.String()
	for path, want := range map[string]int{
		PathPrefix + loc.Object:                        200,
		PathPrefix + "acme/" + strings.Repeat("0", 64): 404,
		PathPrefix + "other/" + key:                    404,
		PathPrefix + "acme/" + key + "/x":              400,
		PathPrefix + "acme/../" + key:                  400,
		PathPrefix + "..%2f..%2fetc/passwd":            400,
		PathPrefix + "acme%2f" + key:                   400,
		PathPrefix + "acme/" + strings.ToUpper(key):    400,
		PathPrefix + "a.b/" + key:                      400,
		PathPrefix + "%2e%2e/" + key:                   400,
		PathPrefix + "acme/" + key + "?x=1":            400,
		"/v1/payload":                                  400,
		"/etc/passwd":                                  400,
		"/v1/other/acme/" + key:                        400,
	} {
		conn, err := net.Dial("tcp", a.server.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		// A raw request, so no client library cleans the path first.
		conn.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
		var resp bytes.Buffer
		resp.ReadFrom(conn)
		conn.Close()
		status := strings.SplitN(resp.String(), " ", 3)
		if len(status) < 2 || status[1] != strconv.Itoa(want) {
			t.Errorf("GET %s: %q, want %d", path, firstLine(resp.String()), want)
		}
	}
	resp, err := http.Post(a.server.URL+PathPrefix+loc.Object, "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %s", resp.Status)
	}
}

func firstLine(s string) string { line, _, _ := strings.Cut(s, "\r\n"); return line }

// corruptSource serves a fixed blob, whatever it claims.
type corruptSource struct{ blob *payload.Blob }

func (c corruptSource) Open(context.Context, payload.ObjectID) (*payload.Blob, error) {
	return payload.NewBlob(c.blob.Data, c.blob.Checksum, nil), nil
}

func TestCorruptionIsNeverAValue(t *testing.T) {
	ctx := context.Background()
	v := value(1000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	loc := payload.Location{Transport: payload.TransportHTTP, Object: testObj.String(), Size: int64(len(enc)), Checksum: sum}
	for name, blob := range map[string]*payload.Blob{
		"flipped byte":   payload.NewBlob(append(bytes.Clone(enc[:len(enc)-1]), enc[len(enc)-1]^1), sum, nil),
		"short":          payload.NewBlob(enc[:len(enc)-64], sum, nil),
		"other checksum": payload.NewBlob(enc, payload.Checksum{1}, nil),
		"longer":         payload.NewBlob(append(bytes.Clone(enc), make([]byte, 64)...), sum, nil),
		"corrupt header": payload.NewBlob(append([]byte("XXXXXXXX"), enc[8:]...), sum, nil),
	} {
		srv := httptest.NewServer(newServer(t, corruptSource{blob}))
		tr, _ := NewTransport("b", "http://127.0.0.1:1", payload.NewMemoryStore("b", 0))
		loc.Address = srv.URL
		got, err := tr.Get(ctx, loc)
		srv.Close()
		if !errors.Is(err, payload.ErrCorrupt) || got != nil {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	tr, _ := NewTransport("b", "http://127.0.0.1:1", payload.NewMemoryStore("b", 0), WithMaxSize(100))
	if _, err := tr.Get(ctx, loc); !errors.Is(err, payload.ErrTooLarge) {
		t.Errorf("over the size limit: %v", err)
	}
}

func TestServerDown(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	tr, _ := NewTransport("b", "http://127.0.0.1:1", payload.NewMemoryStore("b", 0))
	loc := payload.Location{Transport: payload.TransportHTTP, Address: "http://" + addr, Object: testObj.String(), Size: 128}
	if _, err := tr.Get(context.Background(), loc); !errors.Is(err, payload.ErrUnavailable) {
		t.Fatalf("server down: %v", err)
	}
	for _, bad := range []string{"", "ftp://x", "http://", "x:y"} {
		if _, err := NewTransport("b", bad, payload.NewMemoryStore("b", 0)); err == nil {
			t.Errorf("advertise %q accepted", bad)
		}
	}
}

// FuzzServePath: whatever path is requested, the server answers 200 only
// for the one object it holds, and 400/404/405 otherwise; never a panic.
func FuzzServePath(f *testing.F) {
	store := payload.NewMemoryStore("a", 0)
	loc, _ := store.Put(context.Background(), testObj, value(64))
	h := newServer(f, store)
	f.Add("GET", PathPrefix+loc.Object)
	f.Add("GET", PathPrefix+"acme/../"+testObj.Key.String())
	f.Add("HEAD", PathPrefix+"%2e%2e/x")
	f.Add("POST", "/")
	f.Fuzz(func(t *testing.T, method, path string) {
		req, err := http.NewRequest(method, "http://x"+path, nil)
		if err != nil || req.URL == nil {
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			if req.URL.EscapedPath() != PathPrefix+loc.Object || (method != "GET" && method != "HEAD") {
				t.Fatalf("%s %q served", method, path)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed:
		default:
			t.Fatalf("%s %q: %d", method, path, rec.Code)
		}
	})
}

// openCount is a Source that counts the blobs it has open.
type openCount struct {
	src  Source
	open atomic.Int64
}

func (c *openCount) Open(ctx context.Context, obj payload.ObjectID) (*payload.Blob, error) {
	b, err := c.src.Open(ctx, obj)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return payload.NewBlob(b.Data, b.Checksum, func() error { c.open.Add(-1); return b.Close() }), nil
}

// A client that asks for a value and stops reading holds the handler,
// and the value's blob (an shm mapping), for the write stall only: it held
// them until the client went away. A pull on a
// connection after a completed one is not cut short by the first one's
// deadline.
func TestAClientThatStopsReadingIsDropped(t *testing.T) {
	store := payload.NewMemoryStore("n", 0)
	if _, err := store.Put(context.Background(), testObj, value(64<<20)); err != nil {
		t.Fatal(err)
	}
	src := &openCount{src: store}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: newServer(t, src, WithWriteStall(200*time.Millisecond)), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	defer srv.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(c, "GET %s%s HTTP/1.1\r\nHost: x\r\n\r\n", PathPrefix, testObj)
	waitUntil(t, "the server took the blob", func() bool { return src.open.Load() == 1 })
	waitUntil(t, "the server dropped the blob of a client that stopped reading", func() bool { return src.open.Load() == 0 })

	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	for i := range 2 {
		resp, err := hc.Get("http://" + l.Addr().String() + PathPrefix + testObj.String())
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || n != resp.ContentLength {
			t.Fatalf("pull %d on one connection: %d, %d of %d bytes, %v", i, resp.StatusCode, n, resp.ContentLength, err)
		}
		time.Sleep(300 * time.Millisecond) // past the pull's last write deadline
	}
}

// waitUntil polls cond until it holds, or fails the test after 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// newServer is NewServer, failing the test on an option it refuses.
func newServer(t testing.TB, src Source, opts ...ServerOption) *Server {
	t.Helper()
	s, err := NewServer(src, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A bad option is payload.ErrInvalidOption, from the server and the
// transport alike.
func TestOptionsAreValidated(t *testing.T) {
	store := payload.NewMemoryStore("a", 0)
	for _, o := range []ServerOption{WithServerToken(""), WithTenantToken("acme", ""), WithWriteStall(0), WithLogger(nil)} {
		if _, err := NewServer(store, o); !errors.Is(err, payload.ErrInvalidOption) {
			t.Fatalf("NewServer: %v, want payload.ErrInvalidOption", err)
		}
	}
	for _, o := range []Option{WithHTTPClient(nil), WithMaxSize(0)} {
		if _, err := NewTransport("a", "http://127.0.0.1:1", store, o); !errors.Is(err, payload.ErrInvalidOption) {
			t.Fatalf("NewTransport: %v, want payload.ErrInvalidOption", err)
		}
	}
}
