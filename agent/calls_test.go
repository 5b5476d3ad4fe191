package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/coordinator"
	embnode "github.com/embcache/embcache/node"
)

// TestKeyBytes: the key of bytes sent as they are (POST /v1/key/bytes) is
// the key of the same bytes sent in JSON, in both modes; bad calls are 400.
func TestKeyBytes(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	for _, size := range []int{0, 1, 200 << 10, 2<<20 + 4} {
		data := bytes.Repeat([]byte{7, 1, 8, 2}, size/4+1)[:size]
		want, err := c.Key(ctx, agent.KeyRequest{Config: testConfig(), Mode: "raw-bytes", Data: data})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.KeyBytes(ctx, testConfig(), "raw-bytes", "", nil, bytes.NewReader(data))
		if err != nil || got.KeyRef != want.KeyRef {
			t.Fatalf("raw %d bytes: %+v %v, want %+v", size, got, err, want)
		}
		if size%4 != 0 {
			continue
		}
		shape := []int64{2, int64(size / 8)}
		if size%8 != 0 {
			shape = []int64{int64(size / 4)}
		}
		want, err = c.Key(ctx, agent.KeyRequest{Config: testConfig(), Mode: "decoded-tensor", DType: "float32", Shape: shape, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		got, err = c.KeyBytes(ctx, testConfig(), "decoded-tensor", "float32", shape, bytes.NewReader(data))
		if err != nil || got.KeyRef != want.KeyRef {
			t.Fatalf("tensor %v: %+v %v, want %+v", shape, got, err, want)
		}
	}
	// A scalar's shape is [] on both paths; no shape is refused on both,
	// never taken for a scalar's (it was, in JSON; the bytes path took
	// shape= for a scalar while the key command refused it).
	scalar := []byte{0, 0, 128, 63}
	want, err := c.Key(ctx, agent.KeyRequest{Config: testConfig(), Mode: "decoded-tensor", DType: "float32", Shape: []int64{}, Data: scalar})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.KeyBytes(ctx, testConfig(), "decoded-tensor", "float32", []int64{}, bytes.NewReader(scalar)); err != nil || got.KeyRef != want.KeyRef {
		t.Fatalf("a scalar: %+v %v, want %+v", got, err, want)
	}
	// A config as a file holds it (indented, over lines) is the same config:
	// it was refused by the HTTP transport, a header holding no newline.
	indented, err := json.MarshalIndent(testConfigMap(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.KeyBytes(ctx, indented, "decoded-tensor", "float32", []int64{}, bytes.NewReader(scalar)); err != nil || got.KeyRef != want.KeyRef {
		t.Fatalf("an indented config: %+v %v, want %+v", got, err, want)
	}
	noEpoch := testConfigMap()
	delete(noEpoch, "weight_epoch")
	for name, call := range map[string]func() error{
		"no config": func() error { _, err := c.KeyBytes(ctx, nil, "raw-bytes", "", nil, strings.NewReader("x")); return err },
		"missing field": func() error {
			_, err := c.KeyBytes(ctx, configJSON(noEpoch), "raw-bytes", "", nil, strings.NewReader("x"))
			return err
		},
		"tokens mode": func() error {
			_, err := c.KeyBytes(ctx, testConfig(), "tokens", "", nil, strings.NewReader("x"))
			return err
		},
		"short tensor": func() error {
			_, err := c.KeyBytes(ctx, testConfig(), "decoded-tensor", "float32", []int64{4}, strings.NewReader("abc"))
			return err
		},
		"no shape": func() error {
			_, err := c.KeyBytes(ctx, testConfig(), "decoded-tensor", "float32", nil, bytes.NewReader(scalar))
			return err
		},
		"no shape in JSON": func() error {
			_, err := c.Key(ctx, agent.KeyRequest{Config: testConfig(), Mode: "decoded-tensor", DType: "float32", Data: scalar})
			return err
		},
		"bad dtype": func() error {
			_, err := c.KeyBytes(ctx, testConfig(), "decoded-tensor", "float33", []int64{1}, strings.NewReader("abcd"))
			return err
		},
	} {
		var apiErr *agent.APIError
		if err := call(); !errors.As(err, &apiErr) || apiErr.Status != 400 {
			t.Errorf("%s: %v, want a 400", name, err)
		}
	}
}

// TestGetNeverReserves: a get of a key nobody computes is a miss at once,
// and reserves nothing (a lookup after it gets the reservation); a get
// while the key computes is a miss too, not a wait; after the commit, a get
// on another node pulls the value.
func TestGetNeverReserves(t *testing.T) {
	url := startServer(t).ClientURL()
	n1, n2 := startNode(t, url, "n1"), startNode(t, url, "n2")
	a, b := client(t, n1), client(t, n2)
	ctx := context.Background()
	ref := keyOf(t, a, "get-me")
	for _, c := range []*agent.Client{a, b} {
		if r, err := c.Get(ctx, ref, "g1"); err != nil || r.Status != agent.StatusMiss || r.Value != nil {
			t.Fatalf("get before anyone computes: %+v %v", r, err)
		}
	}
	res, err := b.Lookup(ctx, ref, "l1")
	if err != nil || res.Status != agent.StatusReserved {
		t.Fatalf("lookup after a get: %+v %v", res, err)
	}
	if r, err := a.Get(ctx, ref, "g2"); err != nil || r.Status != agent.StatusMiss {
		t.Fatalf("get while computing: %+v %v", r, err)
	}
	want := []byte("computed once")
	if _, err := b.Commit(ctx, res.Reservation, "l1", "uint8", []int64{int64(len(want))}, want); err != nil {
		t.Fatal(err)
	}
	var r agent.LookupResponse
	waitFor(t, func() bool { // the commit lands after its answer
		r, err = a.Get(ctx, ref, "g3")
		return err != nil || r.Status != agent.StatusMiss
	})
	if err != nil || r.Status != agent.StatusHit || r.Path != "remote-hit" || !bytes.Equal(mapped(t, r.Value), want) {
		t.Fatalf("get after the commit: %+v %v", r, err)
	}
	if n, err := a.Release(ctx, "g3"); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
}

// TestEndedReservationsSayWhy: a call on a reservation that has ended is
// answered 410 with why (compute_timeout, reservation_ended), not a 404.
func TestEndedReservationsSayWhy(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1", func(o *embnode.Options) {
		// The reserve counts in the compute timeout: not too short for a
		// loaded machine.
		o.Cache = []coordinator.Option{coordinator.WithComputeTimeout(time.Second)}
	})
	c := client(t, n)
	ctx := context.Background()
	code := func(err error) string {
		var apiErr *agent.APIError
		if !errors.As(err, &apiErr) {
			return "not an APIError: " + errString(err)
		}
		if apiErr.Status != 410 {
			return "status " + apiErr.Message
		}
		return apiErr.Code
	}
	reserve := func(input string) (agent.KeyRef, string) {
		ref := keyOf(t, c, input)
		r, err := c.Lookup(ctx, ref, "r")
		if err != nil || r.Status != agent.StatusReserved {
			t.Fatalf("%+v %v", r, err)
		}
		return ref, r.Reservation
	}

	_, expired := reserve("too slow")
	waitFor(t, func() bool { return n.srv.Stats().Agent.Reservations == 0 })
	if _, err := c.Commit(ctx, expired, "r", "uint8", []int64{1}, []byte{1}); code(err) != "compute_timeout" {
		t.Errorf("commit past the compute timeout: %v", err)
	}

	_, abandoned := reserve("given up")
	if err := c.Abandon(ctx, abandoned, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, abandoned, "r", "uint8", []int64{1}, []byte{1}); code(err) != "reservation_ended" ||
		!strings.Contains(err.Error(), "changed my mind") {
		t.Errorf("commit after abandon: %v", err)
	}

	_, done := reserve("committed")
	if _, err := c.Commit(ctx, done, "r", "uint8", []int64{1}, []byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, done, "r", "uint8", []int64{1}, []byte{1}); code(err) != "reservation_ended" {
		t.Errorf("second commit: %v", err)
	}
	if err := c.Abandon(ctx, done, ""); code(err) != "reservation_ended" {
		t.Errorf("abandon after commit: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestPinsBelongToTheClient: a client's pins outlive any one of its
// connections (a pool may close idle ones) and end with its last.
func TestPinsBelongToTheClient(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	ctx := context.Background()
	first := agent.Dial(n.socket)
	defer first.Close()
	second := agent.Dial(n.socket)
	second.ID = first.ID // the same process, another connection
	ref := keyOf(t, first, "pinned")
	r, err := first.Lookup(ctx, ref, "req")
	if err != nil || r.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := first.Commit(ctx, r.Reservation, "req", "uint8", []int64{3}, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if r, err := second.Lookup(ctx, ref, "req"); err != nil || r.Status != agent.StatusHit {
		t.Fatalf("%+v %v", r, err)
	}
	second.Close()
	waitFor(t, func() bool { return n.srv.Stats().Agent.Connections == 1 })
	if released, err := first.Release(ctx, "req"); err != nil || released != 1 {
		t.Fatalf("the pin taken on a closed connection of a live client: released %d, %v; want 1", released, err)
	}

	// A connection that only made calls naming the client (ClientHeader:
	// a stats call here) keeps its pins too.
	if r, err := first.Lookup(ctx, ref, "req3"); err != nil || r.Status != agent.StatusHit {
		t.Fatalf("%+v %v", r, err)
	}
	statsOnly := agent.Dial(n.socket)
	statsOnly.ID = first.ID
	if _, err := statsOnly.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	first.Close()
	waitFor(t, func() bool { return n.srv.Stats().Agent.Connections == 1 })
	if released, err := statsOnly.Release(ctx, "req3"); err != nil || released != 1 {
		t.Fatalf("pins of a client whose other connection made no lookup: released %d, %v; want 1", released, err)
	}
	statsOnly.Close()

	if r, err := second.Lookup(ctx, ref, "req2"); err != nil || r.Status != agent.StatusHit {
		t.Fatalf("%+v %v", r, err)
	}
	first.Close()
	second.Close()
	waitFor(t, func() bool { return n.srv.Stats().Agent.Connections == 0 })
	third := agent.Dial(n.socket)
	defer third.Close()
	third.ID = first.ID
	if released, err := third.Release(ctx, "req2"); err != nil || released != 0 {
		t.Fatalf("after the client's last connection closed: released %d, %v; want 0", released, err)
	}
}

// TestKeySlot: an input written into the connection's key slot is keyed
// where it lies, with the key of the same bytes sent as a body; another
// connection cannot name it; the slot's file goes with its connection.
func TestKeySlot(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	hc := httpClient(t, n.socket) // one connection: the slot is its own
	st, _, body := call(t, hc, "/v1/key/slot", "s.1", agent.KeySlotRequest{Size: 3 << 20})
	var slot agent.SlotResponse
	if err := json.Unmarshal(body, &slot); st != 200 || err != nil {
		t.Fatalf("key slot: %d %s", st, body)
	}
	if fi, err := os.Stat(slot.File); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key slot %s: %v %v, want 0600 (0660 with a group: TestTheGroupGetsIn) whatever the agent's umask", slot.File, fi.Mode(), err)
	}
	keyIn := func(hc *http.Client, query string) (int, agent.KeyResponse) {
		req, _ := http.NewRequest(http.MethodPost, "http://agent/v1/key/bytes?"+query, nil)
		req.Header.Set(agent.ConfigHeader, string(testConfig()))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var k agent.KeyResponse
		json.NewDecoder(resp.Body).Decode(&k)
		return resp.StatusCode, k
	}
	for _, size := range []int{0, 5, 2 << 20, 3 << 20} {
		data := bytes.Repeat([]byte{9, 8, 7, 6}, size/4+1)[:size]
		writeAt(t, slot.File, data)
		want, err := c.KeyBytes(ctx, testConfig(), "raw-bytes", "", nil, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		st, got := keyIn(hc, fmt.Sprintf("mode=raw-bytes&slot=%s&length=%d", slot.Slot, size))
		if st != 200 || got.KeyRef != want.KeyRef {
			t.Fatalf("%d bytes in the slot: %d %+v, want %+v", size, st, got, want)
		}
		if size%4 == 0 {
			want, _ := c.KeyBytes(ctx, testConfig(), "decoded-tensor", "int32", []int64{int64(size / 4)}, bytes.NewReader(data))
			st, got := keyIn(hc, fmt.Sprintf("mode=decoded-tensor&dtype=int32&shape=%d&slot=%s&length=%d", size/4, slot.Slot, size))
			if st != 200 || got.KeyRef != want.KeyRef {
				t.Fatalf("tensor of %d bytes in the slot: %d %+v, want %+v", size, st, got, want)
			}
		}
	}
	if st, _ := keyIn(hc, fmt.Sprintf("mode=raw-bytes&slot=%s&length=%d", slot.Slot, 3<<20+1)); st != 400 {
		t.Errorf("a length past the slot: %d, want 400", st)
	}
	// A client that cuts the file short under the agent's mapping gets an
	// error (the read faults), and the agent lives on.
	if err := os.Truncate(slot.File, 4096); err != nil {
		t.Fatal(err)
	}
	if st, _ := keyIn(hc, fmt.Sprintf("mode=raw-bytes&slot=%s&length=%d", slot.Slot, 2<<20)); st != 400 {
		t.Errorf("a slot cut short: %d, want 400", st)
	}
	if _, err := c.KeyBytes(ctx, testConfig(), "raw-bytes", "", nil, strings.NewReader("alive")); err != nil {
		t.Fatalf("the agent after a fault: %v", err)
	}
	other := httpClient(t, n.socket)
	if st, _ := keyIn(other, fmt.Sprintf("mode=raw-bytes&slot=%s&length=1", slot.Slot)); st != 400 {
		t.Errorf("another connection's slot: %d, want 400", st)
	}
	hc.CloseIdleConnections()
	waitFor(t, func() bool { _, err := os.Stat(slot.File); return os.IsNotExist(err) })
}

// writeAt writes data at the start of file without truncating it, as a
// client writing through its mapping does.
func writeAt(t *testing.T, file string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
}

// TestClientMadeSlot: a reservation's answer names a slot file the client
// makes itself (no slot call); a commit of it is the value; a link there is
// refused; a reservation that ends without a commit takes the file away.
func TestClientMadeSlot(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	ref := keyOf(t, c, "client-made slot")
	r, err := c.Lookup(ctx, ref, "r")
	if err != nil || r.Status != agent.StatusReserved || r.SlotFile == "" {
		t.Fatalf("%+v %v", r, err)
	}
	want := []byte("written by the client")
	if err := os.WriteFile(r.SlotFile, want, 0o660); err != nil {
		t.Fatal(err)
	}
	var done agent.LookupResponse
	if err := post(n.socket, "/v1/commit", agent.CommitRequest{Reservation: r.Reservation, Client: c.ID, RequestID: "r",
		DType: "uint8", Shape: []int64{int64(len(want))}, Slot: r.Reservation}, &done); err != nil || done.Status != agent.StatusAccepted {
		t.Fatalf("commit: %+v %v", done, err)
	}
	hit, err := c.Lookup(ctx, ref, "r")
	if err != nil || hit.Status != agent.StatusHit || !bytes.Equal(mapped(t, hit.Value), want) {
		t.Fatalf("%+v %v", hit, err)
	}

	// A link at the slot's path is not followed.
	ref2 := keyOf(t, c, "linked slot")
	r2, err := c.Lookup(ctx, ref2, "r")
	if err != nil || r2.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", r2, err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("not yours"), 0o600)
	if err := os.Symlink(secret, r2.SlotFile); err != nil {
		t.Fatal(err)
	}
	var apiErr *agent.APIError
	err = post(n.socket, "/v1/commit", agent.CommitRequest{Reservation: r2.Reservation, Client: c.ID, RequestID: "r",
		DType: "uint8", Shape: []int64{9}, Slot: r2.Reservation}, &done)
	if !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("commit of a link: %v, want a 400", err)
	}
	// The reservation is still the client's: it abandons, and the path goes.
	if err := c.Abandon(ctx, r2.Reservation, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(r2.SlotFile); !os.IsNotExist(err) {
		t.Fatalf("slot path after the reservation ended: %v", err)
	}
	c.Release(ctx, "r")
}

// TestSlotCutShort: a client that cuts its slot short, before its commit
// or right after the commit is accepted, gets a 400 or loses its commit
// (the key is free again); the agent never maps the slot, so it never
// faults (SIGBUS) and answers on.
func TestSlotCutShort(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	commit := func(r agent.LookupResponse, size int) error {
		var done agent.LookupResponse
		return post(n.socket, "/v1/commit", agent.CommitRequest{Reservation: r.Reservation, Client: c.ID, RequestID: "r",
			DType: "uint8", Shape: []int64{int64(size)}, Slot: r.Reservation}, &done)
	}
	ref := keyOf(t, c, "cut before")
	r, err := c.Lookup(ctx, ref, "r")
	if err != nil || r.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", r, err)
	}
	os.WriteFile(r.SlotFile, make([]byte, 100), 0o640)
	var apiErr *agent.APIError
	if err := commit(r, 4096); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("a slot shorter than its shape: %v, want a 400", err)
	}
	c.Abandon(ctx, r.Reservation, "test")

	const size = 64 << 20
	ref = keyOf(t, c, "cut after")
	r, err = c.Lookup(ctx, ref, "r")
	if err != nil || r.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", r, err)
	}
	if err := os.WriteFile(r.SlotFile, bytes.Repeat([]byte{7}, size), 0o640); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(r.SlotFile, os.O_WRONLY, 0) // held open, as a client could
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := commit(r, size); err != nil {
		t.Fatal(err)
	}
	f.Truncate(0) // while the agent may be reading it
	// The agent answers on, and the key is either committed whole or free.
	got, err := c.Lookup(ctx, ref, "r2")
	if err != nil {
		t.Fatal(err)
	}
	switch got.Status {
	case agent.StatusHit:
		if data := mapped(t, got.Value); len(data) != size || data[size-1] != 7 {
			t.Fatalf("a hit of %d bytes", len(data))
		}
	case agent.StatusReserved:
		c.Abandon(ctx, got.Reservation, "test")
	}
	c.Release(ctx, "r2")
}

// TestKeyBytesNamesAreGivenOnce: each header and parameter of /v1/key/bytes
// is given once and belongs to the mode. The first of two config headers
// or shapes won, and a misspelt Shape= keyed the tensor as a scalar.
func TestKeyBytesNamesAreGivenOnce(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", n.socket)
	}}}
	defer hc.CloseIdleConnections()
	other := testConfigMap()
	other["tenant"] = "other"
	post := func(query string, configs ...json.RawMessage) int {
		req, _ := http.NewRequest(http.MethodPost, "http://agent/v1/key/bytes?"+query, strings.NewReader("abcd"))
		for _, c := range configs {
			req.Header.Add(agent.ConfigHeader, string(c))
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("mode=decoded-tensor&dtype=uint8&shape=4", testConfig()); code != 200 {
		t.Fatalf("a good call: %d", code)
	}
	for name, code := range map[string]int{
		"two configs":   post("mode=raw-bytes", testConfig(), configJSON(other)),
		"two shapes":    post("mode=decoded-tensor&dtype=uint8&shape=4&shape=2,2", testConfig()),
		"two dtypes":    post("mode=decoded-tensor&dtype=uint8&dtype=int8&shape=4", testConfig()),
		"two modes":     post("mode=raw-bytes&mode=decoded-tensor&dtype=uint8&shape=4", testConfig()),
		"Shape":         post("mode=decoded-tensor&dtype=float32&Shape=2", testConfig()),
		"raw's shape":   post("mode=raw-bytes&shape=4", testConfig()),
		"unknown param": post("mode=raw-bytes&bogus=1", testConfig()),
	} {
		if code != 400 {
			t.Errorf("%s: %d, want a 400", name, code)
		}
	}
}
