package agent_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/coordinator"
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
	n := startNode(t, startServer(t).ClientURL(), "n1", coordinator.WithComputeTimeout(300*time.Millisecond))
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
