package agent_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/agent"
	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/localdir/localdirtest"
	embnode "github.com/embcache/embcache/node"
	"github.com/embcache/embcache/payload/shm"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	localdirtest.Main() // a child acting as another user
	goleak.VerifyTestMain(m)
}

// node is one agent: its own cache, shm store and payload server, as on a
// node of its own.
type node struct {
	socket string
	srv    *agent.Server
	cache  *coordinator.Cache
	store  *shm.Store
	slots  string // the slot directory
}

func startServer(t testing.TB) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// startNode starts a node named name with an agent; edits change its
// node's options.
func startNode(t testing.TB, url, name string, edits ...func(*embnode.Options)) *node {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	o := embnode.Options{NATSURL: url, Name: name, ShmDir: filepath.Join(dir, "shm"), PayloadListen: "127.0.0.1:0",
		Strict: true, LeaseTTL: time.Second, NoEvents: true}
	for _, edit := range edits {
		edit(&o)
	}
	nn, err := embnode.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := nn.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nn.Close() })
	cache, store := nn.Cache(), nn.Store()
	// Strict caches answer "store unavailable" until the bucket is open,
	// which a loaded machine (make test runs every package at once) may
	// take longer than one op timeout to do: the tests start once it is.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := cache.Ping(pctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: the store never became usable: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv, err := agent.New(cache, store)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{socket: filepath.Join(dir, "agent.sock"), srv: srv, cache: cache, store: store, slots: store.Dir() + ".slots"}
	ul, err := net.Listen("unix", n.socket)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ul) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return n
}

func client(t testing.TB, n *node) *agent.Client {
	c := agent.Dial(n.socket)
	t.Cleanup(c.Close)
	return c
}

func testConfig() json.RawMessage { return configJSON(testConfigMap()) }

func configJSON(m map[string]any) json.RawMessage {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func testConfigMap() map[string]any {
	return map[string]any{
		"cache_schema_version": 1, "model_id": "Qwen/Qwen2.5-Omni-7B", "model_revision": "r1",
		"encoder_config_hash": "b3:vit", "processor_version": "p1", "resize_mode": "bicubic",
		"image_size": []int{448, 448}, "crop_mode": "center", "normalize_mean": []float64{0.5, 0.5, 0.5},
		"normalize_std": []float64{0.5, 0.5, 0.5}, "audio_sample_rate": 0, "audio_codec_version": "",
		"audio_codec_config_hash": "", "video_frame_stride": 0, "input_dtype": "bfloat16",
		"modality": "image", "weight_epoch": 0, "tenant": "acme",
	}
}

func keyOf(t testing.TB, c *agent.Client, input string) agent.KeyRef {
	t.Helper()
	k, err := c.Key(context.Background(), agent.KeyRequest{Config: testConfig(), Mode: "raw-bytes", Data: []byte(input)})
	if err != nil {
		t.Fatal(err)
	}
	return k.KeyRef
}

func mapped(t testing.TB, h *agent.Hit) []byte {
	t.Helper()
	data, unmap, err := agent.Map(h)
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.Clone(data)
	unmap()
	return out
}

// TestKeyVectors: the agent names the keys of cachekey/testdata/vectors.json.
func TestKeyVectors(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	raw, err := os.ReadFile("../cachekey/testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Name       string          `json:"name"`
			Mode       string          `json:"mode"`
			Key        string          `json:"key"`
			InputHex   string          `json:"input_hex"`
			DType      string          `json:"dtype"`
			Config     json.RawMessage `json:"config"`
			Shape      []int64         `json:"shape"`
			Tokens     []uint32        `json:"tokens"`
			BlockSize  int             `json:"block_size"`
			PrefixKeys []string        `json:"prefix_keys"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &file); err != nil || len(file.Vectors) == 0 {
		t.Fatal(err, len(file.Vectors))
	}
	for _, v := range file.Vectors {
		data, err := hex.DecodeString(v.InputHex)
		if err != nil {
			t.Fatal(err)
		}
		if v.Mode == "tokens" {
			data = nil // a tokens request carries no data
		}
		got, err := c.Key(context.Background(), agent.KeyRequest{Config: v.Config, Mode: v.Mode, Data: data,
			DType: v.DType, Shape: v.Shape, Tokens: v.Tokens, BlockSize: v.BlockSize})
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if got.Key != v.Key || len(got.PrefixKeys) != len(v.PrefixKeys) {
			t.Errorf("%s: key %s (%d prefixes), want %s (%d)", v.Name, got.Key, len(got.PrefixKeys), v.Key, len(v.PrefixKeys))
		}
		for i := range v.PrefixKeys {
			if i < len(got.PrefixKeys) && got.PrefixKeys[i] != v.PrefixKeys[i] {
				t.Errorf("%s: prefix key %d %s, want %s", v.Name, i, got.PrefixKeys[i], v.PrefixKeys[i])
			}
		}
	}
}

// TestKeyRejectsMissingField: a config without one field is refused, naming
// it; a zero would silently share keys between preprocessings.
func TestKeyRejectsMissingField(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	var apiErr *agent.APIError
	missing, unknown := testConfigMap(), testConfigMap()
	delete(missing, "crop_mode")
	unknown["crop"] = "center"
	for field, cfg := range map[string]map[string]any{"crop_mode": missing, `"crop"`: unknown} {
		_, err := c.Key(context.Background(), agent.KeyRequest{Config: configJSON(cfg), Mode: "raw-bytes", Data: []byte("x")})
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || !bytes.Contains([]byte(apiErr.Message), []byte(field)) {
			t.Fatalf("%s: err %v", field, err)
		}
	}
	for _, req := range []agent.KeyRequest{
		{Config: testConfig(), Mode: "pixels"},
		{Config: testConfig(), Mode: "decoded-tensor", DType: "float32", Shape: []int64{3}, Data: []byte("x")},
	} {
		if _, err := c.Key(context.Background(), req); !errors.As(err, &apiErr) || apiErr.Status != 400 {
			t.Fatalf("%+v: %v", req, err)
		}
	}
}

// A key request holds the fields its mode keys, and only those: without
// data (absent or null) a raw-bytes request was keyed as the empty input,
// one key for every call that forgot it, and fields of another mode were
// dropped.
func TestKeyRequestFieldsFitTheMode(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	cfg := string(testConfig())
	empty, err := c.Key(context.Background(), agent.KeyRequest{Config: testConfig(), Mode: "raw-bytes", Data: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cachekey.DecodeConfig(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if want, err := cachekey.FromRawBytes(cc, nil); err != nil || empty.Key != want.String() {
		t.Fatalf("the empty input: %s, want %s (%v)", empty.Key, want, err)
	}
	for body, field := range map[string]string{
		`"mode":"raw-bytes"`:                                                             `needs "data"`,
		`"mode":"raw-bytes","data":null`:                                                 `needs "data"`,
		`"mode":"raw-bytes","data":"eA==","tokens":[1,2]`:                                `no "tokens"`,
		`"mode":"raw-bytes","data":"eA==","shape":[1]`:                                   `no "shape"`,
		`"mode":"raw-bytes","data":"eA==","block_size":16`:                               `no "block_size"`,
		`"mode":"decoded-tensor","dtype":"uint8","data":"eA=="`:                          `needs "shape"`,
		`"mode":"decoded-tensor","shape":[1],"data":"eA=="`:                              `needs "dtype"`,
		`"mode":"decoded-tensor","dtype":"uint8","shape":[1]`:                            `needs "data"`,
		`"mode":"decoded-tensor","dtype":"uint8","shape":[1],"data":"eA==","tokens":[1]`: `no "tokens"`,
		`"mode":"tokens"`: `needs "tokens"`,
		`"mode":"tokens","tokens":[1,2],"data":"eA=="`:   `no "data"`,
		`"mode":"tokens","tokens":[1,2],"dtype":"uint8"`: `no "dtype"`,
	} {
		// Each is refused for its field, not for another reason.
		code, msg, err := rawPostBody(n.socket, "/v1/key", `{"config":`+cfg+`,`+body+`}`)
		var answer agent.Error
		if err == nil {
			err = json.Unmarshal([]byte(msg), &answer)
		}
		if err != nil || code != 400 || !strings.Contains(answer.Error, field) {
			t.Errorf("%s: %d %q %v, want a 400 saying %s", body, code, msg, err, field)
		}
	}
	for _, body := range []string{`"mode":"raw-bytes","data":""`, `"mode":"decoded-tensor","dtype":"uint8","shape":[1],"data":"eA=="`} {
		if code, err := rawPost(n.socket, "/v1/key", `{"config":`+cfg+`,`+body+`}`); err != nil || code != 200 {
			t.Errorf("%s: %d %v, want a 200", body, code, err)
		}
	}
}

// A request body's names are exact and given once: encoding/json took
// "Config" for "config" and kept the last of two, so a body with a second
// config (another tenant's) was keyed by it.
func TestKeyRequestNamesAreExact(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	other := testConfigMap()
	other["tenant"] = "other"
	cfg, cfg2 := string(testConfig()), string(configJSON(other))
	if code, err := rawPost(n.socket, "/v1/key", `{"config":`+cfg+`,"mode":"raw-bytes","data":"eA=="}`); err != nil || code != 200 {
		t.Fatalf("a good body: %d %v", code, err)
	}
	for _, body := range []string{
		`{"config":` + cfg + `,"Config":` + cfg2 + `,"mode":"raw-bytes","data":"eA=="}`,
		`{"config":` + cfg + `,"config":` + cfg2 + `,"mode":"raw-bytes","data":"eA=="}`,
		`{"CONFIG":` + cfg + `,"mode":"raw-bytes","data":"eA=="}`,
		`{"config":` + cfg + `,"mode":"raw-bytes","data":"eA==","data":"eQ=="}`,
	} {
		if code, err := rawPost(n.socket, "/v1/key", body); err != nil || code != 400 {
			t.Fatalf("%s: %d %v", body, code, err)
		}
	}
}

// TestReserveSlotCommitHit: the first lookup reserves; the tensor written
// into a slot is committed; every later lookup, on this agent and another,
// maps the same bytes.
// The slot directory is the agent's user's only (0700) without a group;
// with the store's group it is set-group-ID, sticky and 0730: a slot a
// client makes belongs to the directory's group, by which the agent reads
// it, and its other members can neither list the slots nor remove
// another's. (Chmod with 0o2770 left the bit off: Go's FileMode has its
// own bit for it; a new user's walkthrough found it. 0770 let the group
// list and replace any slot.)
func TestSlotDirectoryIsSetGroupID(t *testing.T) {
	url := startServer(t).ClientURL()
	n := startNode(t, url, "n1")
	fi, err := os.Stat(n.slots)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(os.ModeSetgid|os.ModeSticky) != 0 || fi.Mode().Perm() != 0o700 {
		t.Fatalf("slot directory %s without a group: mode %v, want 0700", n.slots, fi.Mode())
	}
	group := strconv.Itoa(os.Getegid())
	n = startNode(t, url, "n2", func(o *embnode.Options) { o.ShmGroup = group })
	if fi, err = os.Stat(n.slots); err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSetgid == 0 || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o730 {
		t.Fatalf("slot directory %s of group %s: mode %v, want set-group-ID, sticky and 0730", n.slots, group, fi.Mode())
	}
}

func TestReserveSlotCommitHit(t *testing.T) {
	url := startServer(t).ClientURL()
	n1, n2 := startNode(t, url, "n1"), startNode(t, url, "n2")
	c1, c2 := client(t, n1), client(t, n2)
	ctx := context.Background()
	ref := keyOf(t, c1, "image-1")
	resp, err := c1.Lookup(ctx, ref, "r1")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	want := bytes.Repeat([]byte{1, 2, 3, 4}, 1024)
	var slot agent.SlotResponse
	if err := post(n1.socket, "/v1/slot", agent.SlotRequest{Reservation: resp.Reservation, Size: int64(len(want))}, &slot); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(slot.File, want, 0o600); err != nil {
		t.Fatal(err)
	}
	var committed agent.LookupResponse
	if err := post(n1.socket, "/v1/commit", agent.CommitRequest{Reservation: resp.Reservation, Client: c1.ID, RequestID: "r1",
		DType: "float32", Shape: []int64{1024}, Slot: slot.Slot}, &committed); err != nil {
		t.Fatal(err)
	}
	if committed.Status != agent.StatusAccepted || committed.Reservation != resp.Reservation || committed.Value != nil {
		t.Fatalf("commit answered %+v", committed)
	}
	var hitFile string
	for _, c := range []*agent.Client{c1, c2} {
		got, err := c.Lookup(ctx, ref, "r2")
		if hitFile == "" && got.Value != nil {
			hitFile = got.Value.File
		}
		if err != nil || got.Status != agent.StatusHit || !bytes.Equal(mapped(t, got.Value), want) ||
			got.Value.DType != "float32" || got.Value.Shape[0] != 1024 || got.Value.Offset%64 != 0 {
			t.Fatalf("%+v %v", got, err)
		}
	}
	if s := n2.cache.Stats(); s.RemoteHits != 1 || s.Computes != 0 {
		t.Fatalf("n2 stats %+v", s)
	}
	if n, err := c2.Release(ctx, "r2"); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	// A hit's file is read-only: a write through it is refused.
	if f, err := os.OpenFile(hitFile, os.O_WRONLY, 0); err == nil {
		f.Close()
		if fi, _ := os.Stat(hitFile); fi.Mode().Perm()&0o222 != 0 {
			t.Fatalf("hit file %s is writable: %v", hitFile, fi.Mode())
		}
	}
}

func post(socket, path string, in, out any) error {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer hc.CloseIdleConnections()
	b, _ := json.Marshal(in)
	resp, err := hc.Post("http://agent"+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e agent.Error
		json.NewDecoder(resp.Body).Decode(&e)
		return &agent.APIError{Status: resp.StatusCode, Code: e.Code, Message: e.Error}
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// TestWaiterGetsCommit: a second client's lookup waits while the first
// computes, and gets the committed value; the compute ran once.
func TestWaiterGetsCommit(t *testing.T) {
	url := startServer(t).ClientURL()
	n1, n2 := startNode(t, url, "n1"), startNode(t, url, "n2")
	a, b, far := client(t, n1), client(t, n1), client(t, n2)
	ctx := context.Background()
	ref := keyOf(t, a, "image-2")
	resp, err := a.Lookup(ctx, ref, "ra")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	type got struct {
		r   agent.LookupResponse
		err error
	}
	near, remote := make(chan got, 1), make(chan got, 1)
	go func() { r, err := b.Lookup(ctx, ref, "rb"); near <- got{r, err} }()
	go func() { r, err := far.Lookup(ctx, ref, "rf"); remote <- got{r, err} }()
	waitFor(t, func() bool { return n2.cache.Stats().Waits == 1 })
	want := []byte("0123456789abcdef")
	if _, err := a.Commit(ctx, resp.Reservation, "ra", "uint8", []int64{16}, want); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan got{near, remote} {
		g := <-ch
		if g.err != nil || g.r.Status != agent.StatusHit || !bytes.Equal(mapped(t, g.r.Value), want) {
			t.Fatalf("%+v %v", g.r, g.err)
		}
	}
	if c := n1.cache.Stats().Computes + n2.cache.Stats().Computes; c != 1 {
		t.Fatalf("%d computes", c)
	}
}

// TestDisconnectHandsOver: a client that disappears while holding a
// reservation lets a waiter on another agent take the key over at once,
// and its pins are released.
func TestDisconnectHandsOver(t *testing.T) {
	url := startServer(t).ClientURL()
	n1, n2 := startNode(t, url, "n1"), startNode(t, url, "n2")
	holder, other := agent.Dial(n1.socket), client(t, n2)
	ctx := context.Background()
	ref := keyOf(t, other, "image-3")
	resp, err := holder.Lookup(ctx, ref, "rh")
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	done := make(chan agent.LookupResponse, 1)
	go func() {
		r, err := other.Lookup(ctx, ref, "ro")
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, func() bool { return n2.cache.Stats().Waits == 1 })
	holder.Close() // the process died: its connection closed
	r := <-done
	if r.Status != agent.StatusReserved {
		t.Fatalf("after the holder left: %+v", r)
	}
	waitFor(t, func() bool {
		s := n1.srv.Stats().Agent
		return s.Disconnects == 1 && s.Reservations == 0 && s.Abandons == 1
	})
	if err := other.Abandon(ctx, r.Reservation, "test over"); err != nil {
		t.Fatal(err)
	}
}

// TestBadRequests: unknown reservations, malformed bodies and values are
// answered with clear errors, never a panic.
func TestBadRequests(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	ctx := context.Background()
	var apiErr *agent.APIError
	if _, err := c.Commit(ctx, "nope", "r", "uint8", []int64{1}, []byte{1}); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Fatalf("unknown reservation: %v", err)
	}
	if err := c.Abandon(ctx, "nope", ""); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Fatalf("abandon unknown: %v", err)
	}
	if _, err := c.Lookup(ctx, agent.KeyRef{Key: "zz", Tenant: "acme"}, "r"); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("bad key: %v", err)
	}
	// A bad tenant is the caller's error, not an internal one (a 500, which
	// the Python client took for an outage and computed without the cache).
	for _, tenant := range []string{"a.b", ">", ""} {
		ref := agent.KeyRef{Key: strings.Repeat("a", 64), Tenant: tenant}
		if _, err := c.Lookup(ctx, ref, "r"); !errors.As(err, &apiErr) || apiErr.Status != 400 {
			t.Fatalf("lookup, tenant %q: %v", tenant, err)
		}
		if _, err := c.Get(ctx, ref, "r"); !errors.As(err, &apiErr) || apiErr.Status != 400 {
			t.Fatalf("get, tenant %q: %v", tenant, err)
		}
	}
	ref := keyOf(t, c, "image-4")
	resp, err := c.Lookup(ctx, ref, "r")
	if err != nil {
		t.Fatal(err)
	}
	// 3 bytes cannot be float32[1]; the reservation stays open for a good commit.
	if _, err := c.Commit(ctx, resp.Reservation, "r", "float32", []int64{1}, []byte{1, 2, 3}); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("bad value: %v", err)
	}
	// No shape is not a scalar's ([]): four bytes were stored as a float32 scalar.
	if _, err := c.Commit(ctx, resp.Reservation, "r", "float32", nil, []byte{1, 2, 3, 4}); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("no shape: %v", err)
	}
	if _, err := c.Commit(ctx, resp.Reservation, "r", "float32", []int64{1}, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"{", `{"key": 7}`, `{"unknown": 1}`, `{"key": "` + ref.Key + `", "tenant": "acme"} x`} {
		resp, err := rawPost(n.socket, "/v1/lookup", body)
		if err != nil || resp != 400 {
			t.Fatalf("%s: %d %v", body, resp, err)
		}
	}
	if s := n.srv.Stats().Agent; s.BadRequests < 6 {
		t.Fatalf("bad requests counted: %+v", s)
	}
}

func rawPost(socket, path, body string) (int, error) {
	code, _, err := rawPostBody(socket, path, body)
	return code, err
}

// rawPostBody is rawPost with the answer's body.
func rawPostBody(socket, path, body string) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("http://agent"+path, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(msg), err
}

// waitFor polls a condition that background NATS work makes true.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeyExactIntegers: a weight epoch past 2^53 keys as Go keys it (a
// float64 on the way would round it, and two epochs would share a key).
func TestKeyExactIntegers(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	m := testConfigMap()
	m["weight_epoch"] = uint64(1<<53 + 1)
	got, err := c.Key(context.Background(), agent.KeyRequest{Config: configJSON(m), Mode: "raw-bytes", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	var cfg cachekey.PreprocessingConfig
	if err := json.Unmarshal(configJSON(m), &cfg); err != nil {
		t.Fatal(err)
	}
	keyer, err := cachekey.NewKeyer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := keyer.RawBytes([]byte("x"))
	if got.Key != want.String() || got.WeightEpoch != 1<<53+1 {
		t.Fatalf("key %s epoch %d, want %s epoch %d", got.Key, got.WeightEpoch, want, uint64(1<<53+1))
	}
}

// httpClient is a plain HTTP client of the agent at socket. Its connections
// stay open until the test ends: a reservation lives as long as the
// connection that made it.
func httpClient(t *testing.T, socket string) *http.Client {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// call posts in (nil: a GET) to path with a CallHeader, and returns the
// answer's status, call header and body.
func call(t *testing.T, hc *http.Client, path, name string, in any) (int, string, []byte) {
	t.Helper()
	method, body := http.MethodGet, []byte(nil)
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			t.Fatal(err)
		}
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, "http://agent"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(agent.CallHeader, name)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := new(bytes.Buffer)
	out.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get(agent.CallHeader), out.Bytes()
}

// TestAnswersNameWhatTheyAnswer: every answer echoes the call it answers
// (errors and 204s too), and lookups, slots, commits and releases name the
// key, reservation, client and request they are for: what a client checks
// before it takes an answer as a value.
func TestAnswersNameWhatTheyAnswer(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c, hc := client(t, n), httpClient(t, n.socket)
	cfg := testConfigMap()
	cfg["weight_epoch"] = 7 // not zero: echoed, not left out (a lookup names its key's config's labels)
	k, err := c.Key(context.Background(), agent.KeyRequest{Config: configJSON(cfg), Mode: "raw-bytes", Data: []byte("image-echo")})
	if err != nil {
		t.Fatal(err)
	}
	ref := k.KeyRef
	decode := func(status int, echoed, want string, body []byte, v any) {
		t.Helper()
		if status/100 != 2 || echoed != want {
			t.Fatalf("call %s: status %d, echoed %q: %s", want, status, echoed, body)
		}
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatal(err)
		}
	}
	checkLookup := func(r agent.LookupResponse, requestID string) {
		t.Helper()
		if r.KeyRef != ref || r.Client != "py-1" || r.RequestID != requestID {
			t.Fatalf("answer names %+v for client %q request %q; asked %+v, py-1, %s", r.KeyRef, r.Client, r.RequestID, ref, requestID)
		}
	}

	var reserved agent.LookupResponse
	st, echoed, body := call(t, hc, "/v1/lookup", "c.1", agent.LookupRequest{KeyRef: ref, Client: "py-1", RequestID: "r1"})
	decode(st, echoed, "c.1", body, &reserved)
	checkLookup(reserved, "r1")
	if reserved.Status != agent.StatusReserved || reserved.Reservation == "" {
		t.Fatalf("%+v", reserved)
	}
	var slot agent.SlotResponse
	st, echoed, body = call(t, hc, "/v1/slot", "c.2", agent.SlotRequest{Reservation: reserved.Reservation, Size: 4})
	decode(st, echoed, "c.2", body, &slot)
	if slot.Reservation != reserved.Reservation {
		t.Fatalf("slot for reservation %q, asked %q", slot.Reservation, reserved.Reservation)
	}
	if err := os.WriteFile(slot.File, []byte("abcd"), 0o600); err != nil {
		t.Fatal(err)
	}
	var committed agent.LookupResponse
	st, echoed, body = call(t, hc, "/v1/commit", "c.3", agent.CommitRequest{Reservation: reserved.Reservation,
		Client: "py-1", RequestID: "r1", DType: "uint8", Shape: []int64{4}, Slot: slot.Slot})
	decode(st, echoed, "c.3", body, &committed)
	checkLookup(committed, "r1")
	if committed.Status != agent.StatusAccepted || committed.Reservation != reserved.Reservation {
		t.Fatalf("%+v", committed)
	}
	var hit agent.LookupResponse
	st, echoed, body = call(t, hc, "/v1/lookup", "c.4", agent.LookupRequest{KeyRef: ref, Client: "py-1", RequestID: "r2"})
	decode(st, echoed, "c.4", body, &hit)
	checkLookup(hit, "r2")
	if hit.Status != agent.StatusHit || !bytes.Equal(mapped(t, hit.Value), []byte("abcd")) {
		t.Fatalf("%+v", hit)
	}
	var released agent.ReleaseResponse
	st, echoed, body = call(t, hc, "/v1/release", "c.5", agent.ReleaseRequest{Client: "py-1", RequestID: "r2"})
	decode(st, echoed, "c.5", body, &released)
	if released != (agent.ReleaseResponse{Released: 1, Client: "py-1", RequestID: "r2"}) {
		t.Fatalf("%+v", released)
	}

	// Answers without a body, and errors, name their call too.
	for _, tc := range []struct {
		path   string
		in     any
		status int
	}{
		{"/v1/abandon", agent.AbandonRequest{Reservation: "nope"}, http.StatusNotFound},
		{"/v1/lookup", agent.LookupRequest{KeyRef: agent.KeyRef{Key: "zz", Tenant: "acme"}, Client: "py-1", RequestID: "r"}, http.StatusBadRequest},
		{"/v1/nothing", struct{}{}, http.StatusNotFound},
		{"/healthz", nil, http.StatusOK},
	} {
		if st, echoed, body := call(t, hc, tc.path, "e.1", tc.in); st != tc.status || echoed != "e.1" {
			t.Errorf("%s: status %d, call %q: %s", tc.path, st, echoed, body)
		}
	}
	ctx := context.Background()
	res, err := c.Lookup(ctx, keyOf(t, c, "image-echo-2"), "r4")
	if err != nil || res.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", res, err)
	}
	if st, echoed, body := call(t, hc, "/v1/abandon", "e.2", agent.AbandonRequest{Reservation: res.Reservation}); st != http.StatusNoContent || echoed != "e.2" {
		t.Fatalf("abandon: %d, call %q: %s", st, echoed, body)
	}

	// The Go client checks real answers' names, and takes them.
	if r, err := c.Lookup(ctx, ref, "r3"); err != nil || r.Status != agent.StatusHit || r.RequestID != "r3" {
		t.Fatalf("%+v %v", r, err)
	}
	if released, err := c.Release(ctx, "r3"); err != nil || released != 1 {
		t.Fatalf("release: %d %v", released, err)
	}
}

// TestClientRefusesMismatchedAnswers: the Go client takes no answer that
// names another call, key, reservation or request (a fake agent forges
// them): ErrMismatch, never a value.
func TestClientRefusesMismatchedAnswers(t *testing.T) {
	type forger func(w http.ResponseWriter, r *http.Request, call string)
	var (
		mu    sync.Mutex
		forge forger // how the fake answers the next call
	)
	setForge := func(f forger) { mu.Lock(); forge = f; mu.Unlock() }
	socket := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		f := forge
		mu.Unlock()
		f(w, r, r.Header.Get(agent.CallHeader))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := client(t, &node{socket: socket})
	ctx := context.Background()
	ref := agent.KeyRef{Key: string(bytes.Repeat([]byte("ab"), 32)), Tenant: "acme"}
	answer := func(call string, v any) forger { // answers v, naming call ("": the call asked)
		return func(w http.ResponseWriter, r *http.Request, echo string) {
			if call != "" {
				echo = call
			}
			w.Header().Set(agent.CallHeader, echo)
			json.NewEncoder(w).Encode(v)
		}
	}
	other := ref
	other.Key = string(bytes.Repeat([]byte("cd"), 32))
	good := agent.LookupResponse{Status: agent.StatusReserved, Reservation: "res-1", KeyRef: ref, Client: c.ID, RequestID: "r1"}

	setForge(answer("", good))
	if r, err := c.Lookup(ctx, ref, "r1"); err != nil || r.Reservation != "res-1" {
		t.Fatalf("a matching answer: %+v %v", r, err)
	}
	for name, lookup := range map[string]forger{
		"another key":     answer("", agent.LookupResponse{Status: agent.StatusReserved, Reservation: "res-1", KeyRef: other, Client: c.ID, RequestID: "r1"}),
		"another request": answer("", agent.LookupResponse{Status: agent.StatusReserved, Reservation: "res-1", KeyRef: ref, Client: c.ID, RequestID: "r2"}),
		"another client":  answer("", agent.LookupResponse{Status: agent.StatusReserved, Reservation: "res-1", KeyRef: ref, Client: "go-2", RequestID: "r1"}),
		"another call":    answer("someone-else.1", good),
	} {
		setForge(lookup)
		if r, err := c.Lookup(ctx, ref, "r1"); !errors.Is(err, agent.ErrMismatch) {
			t.Errorf("%s: %+v %v", name, r, err)
		}
	}
	setForge(answer("", agent.LookupResponse{Status: agent.StatusHit, Reservation: "res-2", KeyRef: ref, Client: c.ID, RequestID: "r1"}))
	if _, err := c.Commit(ctx, "res-1", "r1", "uint8", []int64{1}, []byte{1}); !errors.Is(err, agent.ErrMismatch) {
		t.Errorf("commit of another reservation: %v", err)
	}
	setForge(answer("", agent.ReleaseResponse{Released: 1, Client: c.ID, RequestID: "r2"}))
	if _, err := c.Release(ctx, "r1"); !errors.Is(err, agent.ErrMismatch) {
		t.Errorf("release of another request: %v", err)
	}
	setForge(answer("x.1", agent.KeyResponse{KeyRef: other, Mode: "raw-bytes"}))
	if _, err := c.Key(ctx, agent.KeyRequest{Config: testConfig(), Mode: "raw-bytes", Data: []byte("x")}); !errors.Is(err, agent.ErrMismatch) {
		t.Errorf("key answer to another call: %v", err)
	}
}

// TestCorruptFileIsNotHandedOut: a flipped data byte in the node's file of
// a value is caught before a client maps it: the lookup drops the copy and
// the key is computed again, never a hit on the corrupt bytes.
func TestCorruptFileIsNotHandedOut(t *testing.T) {
	url := startServer(t).ClientURL()
	n := startNode(t, url, "n1")
	c := client(t, n)
	ctx := context.Background()
	ref := keyOf(t, c, "image-corrupt")
	want := bytes.Repeat([]byte{5, 6, 7, 8}, 4096)
	commit(t, n, c, ref, "r1", want)
	first, err := c.Lookup(ctx, ref, "r2")
	if err != nil || first.Status != agent.StatusHit || !bytes.Equal(mapped(t, first.Value), want) {
		t.Fatalf("%+v %v", first, err)
	}
	// Flip a data byte; give the file a new mtime (a write in the same
	// clock tick as the check would keep it; see docs/protocol.md 2.3).
	file := first.Value.File
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, first.Value.Offset+100)
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, first.Value.Offset+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(file, later, later); err != nil {
		t.Fatal(err)
	}
	got, err := c.Lookup(ctx, ref, "r3")
	if err != nil {
		t.Fatal(err)
	}
	switch got.Status {
	case agent.StatusReserved: // the key is computed again
	case agent.StatusHit:
		if !bytes.Equal(mapped(t, got.Value), want) {
			t.Fatal("a corrupt file was handed out as a hit")
		}
	default:
		t.Fatalf("%+v", got)
	}
	if s := n.cache.Stats(); s.PayloadErrors == 0 {
		t.Errorf("no payload error counted: %+v", s)
	}
}

// commit reserves ref for requestID, writes want through a slot and
// commits it as float32.
func commit(t *testing.T, n *node, c *agent.Client, ref agent.KeyRef, requestID string, want []byte) {
	t.Helper()
	resp, err := c.Lookup(context.Background(), ref, requestID)
	if err != nil || resp.Status != agent.StatusReserved {
		t.Fatalf("%+v %v", resp, err)
	}
	var slot agent.SlotResponse
	if err := post(n.socket, "/v1/slot", agent.SlotRequest{Reservation: resp.Reservation, Size: int64(len(want))}, &slot); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(slot.File, want, 0o600); err != nil {
		t.Fatal(err)
	}
	var committed agent.LookupResponse
	if err := post(n.socket, "/v1/commit", agent.CommitRequest{Reservation: resp.Reservation, Client: c.ID, RequestID: requestID,
		DType: "float32", Shape: []int64{int64(len(want) / 4)}, Slot: slot.Slot}, &committed); err != nil {
		t.Fatal(err)
	}
	if committed.Status != agent.StatusAccepted {
		t.Fatalf("commit answered %+v", committed)
	}
}

// A get right after a commit this agent accepted hits: the agent answers
// the commit before it stores the value, and the get waits for that (it
// missed about one time in two; a new user's walkthrough found it).
func TestAGetRightAfterACommitHits(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	want := bytes.Repeat([]byte{1, 2, 3, 4}, 1<<16)
	for i := range 20 {
		ref := keyOf(t, c, fmt.Sprintf("image-%d", i))
		commit(t, n, c, ref, "r1", want)
		resp, err := c.Get(context.Background(), ref, "r2")
		if err != nil || resp.Status != agent.StatusHit {
			t.Fatalf("get %d right after its commit: %+v %v", i, resp, err)
		}
		if got := mapped(t, resp.Value); !bytes.Equal(got, want) {
			t.Fatalf("get %d: other bytes", i)
		}
	}
}

// A commit's value is stored without counting a read of it: the agent's
// wait for it pins and counts nothing (a review found that joining the
// flight counted a local hit per commit, and sent a touch).
func TestACommitCountsNoHit(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	c := client(t, n)
	commit(t, n, c, keyOf(t, c, "image-unread"), "r1", bytes.Repeat([]byte{1, 2, 3, 4}, 1<<10))
	waitFor(t, func() bool { s := n.cache.Stats(); return s.Computes == 1 && s.Local.InFlight == 0 })
	if s := n.cache.Stats(); s.LocalHits != 0 || s.Local.Hits != 0 {
		t.Fatalf("a commit nobody read counted hits: %+v", s)
	}
}

// TestOneAgentPerSlotDirectory: a second agent on a running one's
// --shm-dir emptied its slot directory under its clients (a walkthrough's
// client then failed, its slot file gone); it is refused, and the
// directory is free again once the first has shut down.
func TestOneAgentPerSlotDirectory(t *testing.T) {
	n := startNode(t, startServer(t).ClientURL(), "n1")
	slot := filepath.Join(n.slots, "a-client-slot") // as a client's slot lies
	if err := os.WriteFile(slot, []byte("value"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.New(n.cache, n.store); !errors.Is(err, agent.ErrSlotDirInUse) {
		t.Fatalf("a second agent: %v", err)
	}
	if _, err := os.Stat(slot); err != nil {
		t.Fatalf("the first agent's slot: %v", err)
	}
	if err := n.srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv, err := agent.New(n.cache, n.store)
	if err != nil {
		t.Fatalf("after the first agent's shutdown: %v", err)
	}
	srv.Shutdown(context.Background())
}
