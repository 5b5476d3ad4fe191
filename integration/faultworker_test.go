package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/localcache"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
	"github.com/nats-io/nats.go"
)

// The fault worker: this test binary re-executed (EMBCACHE_WORKER=fault)
// runs EMBCACHE_OPS get-or-computes, one at a time, over EMBCACHE_KEYS
// keys and writes its history to stdout, one JSON line per event.

// faultTenants and faultModels label the keys: key k belongs to
// faultLabels(k), so that an invalidation reaches some keys and not others.
var (
	faultTenants = []string{"itest", "itest2"}
	faultModels  = []string{"m0", "m1"}
)

// labels are a value's tenant and model (every epoch is 0).
type labels struct{ Tenant, Model string }

func (l labels) String() string { return l.Tenant + "/" + l.Model }

func faultLabels(k int) labels {
	return labels{faultTenants[k%len(faultTenants)], faultModels[k/len(faultTenants)%len(faultModels)]}
}

// faultRef is key k's ref, under its labels.
func faultRef(k int) coordinator.Ref {
	var key cachekey.Key
	binary.LittleEndian.PutUint64(key[:], uint64(k)+1000)
	l := faultLabels(k)
	return coordinator.Ref{Tenant: l.Tenant, Key: key, Model: l.Model}
}

// faultValue is what compute id of key k returns: key k's bytes, whose
// first 8 are the compute's id, so that a served value names the compute
// that made it.
func faultValue(k int, id uint64) *payload.Value {
	v := encode(k, false)
	binary.LittleEndian.PutUint64(v.Tensor.Data, id)
	return v
}

// computeID is the compute that made v, as faultValue wrote it.
func computeID(v *payload.Value) uint64 {
	if len(v.Tensor.Data) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(v.Tensor.Data)
}

// hist is one history line of a fault worker.
type hist struct {
	T    int64  `json:"t"`            // unix nanos
	W    string `json:"w"`            // worker
	Ev   string `json:"ev"`           // ready, unlinked, compute-start, compute-end, put, served, error, reserved, committed, refused, heard, done
	Key  int    `json:"key"`          // -1 for worker-wide lines
	Rev  uint64 `json:"rev"`          // fencing token, for lease events
	OK   bool   `json:"ok"`           // served: key k's bytes, under the id of a compute
	Note string `json:"note"`         // error text; a served value's path; the labels an invalidation heard was of
	From int64  `json:"from"`         // unix nanos: when the request this line is part of began
	ID   uint64 `json:"id,omitempty"` // compute-start: the compute's id; served, committed, put: the id of the value's compute
	At   int64  `json:"at,omitempty"` // heard: the invalidated event's Time
}

// histWriter writes a worker's history. The worker makes one request at a
// time: from and id are the current request's, and its lines carry them.
type histWriter struct {
	mu   sync.Mutex
	enc  *json.Encoder
	w    string
	from int64  // guarded by mu
	id   uint64 // the current request's last compute; guarded by mu
}

func (h *histWriter) line(l hist) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l.T, l.W, l.From = time.Now().UnixNano(), h.w, h.from
	if l.ID == 0 && (l.Ev == "committed" || l.Ev == "reserved") {
		l.ID = h.id
	}
	h.enc.Encode(l)
}

func (h *histWriter) emit(ev string, key int, rev uint64, ok bool, note string) {
	h.line(hist{Ev: ev, Key: key, Rev: rev, OK: ok, Note: note})
}

// begin starts a request: the lines until the next begin are its.
func (h *histWriter) begin() {
	h.mu.Lock()
	h.from, h.id = time.Now().UnixNano(), 0
	h.mu.Unlock()
}

// computing notes the current request's compute.
func (h *histWriter) computing(k int, id uint64) {
	h.mu.Lock()
	h.id = id
	h.mu.Unlock()
	h.line(hist{Ev: "compute-start", Key: k, OK: true, ID: id})
}

func keyOf(r coordinator.Ref) int { return keyIndex(r.Key) }

func keyIndex(k cachekey.Key) int {
	n := 0
	for i := 7; i >= 0; i-- {
		n = n<<8 | int(k[i])
	}
	return n - 1000
}

// loggedPuts is the worker's shm store, whose Puts it notes ("put", at
// their end, of the value's compute): a Put that lands after its lease's
// deadline (its worker stopped in the middle) replaces the payload of a
// value committed meanwhile by another worker.
type loggedPuts struct {
	*shm.Store
	h *histWriter
}

func (p loggedPuts) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	loc, err := p.Store.Put(ctx, obj, v)
	if err == nil {
		p.h.line(hist{Ev: "put", Key: keyIndex(obj.Key), OK: true, ID: computeID(v)})
	}
	return loc, err
}

func (h *histWriter) Reserved(r coordinator.Ref, rev uint64) {
	h.emit("reserved", keyOf(r), rev, true, "")
}
func (h *histWriter) Committed(r coordinator.Ref, rev uint64, _ payload.Checksum) {
	h.emit("committed", keyOf(r), rev, true, "")
}
func (h *histWriter) Refused(r coordinator.Ref, rev uint64, err error) {
	h.emit("refused", keyOf(r), rev, false, err.Error())
}

// Invalidated is the worker's Cache applying an invalidated event
// (coordinator.InvalidationObserver): from then on it serves no value of
// those labels computed before the invalidation.
func (h *histWriter) Invalidated(tenant, model string, _ uint64, at time.Time) {
	h.line(hist{Ev: "heard", Key: -1, OK: true, Note: labels{tenant, model}.String(), At: at.UnixNano()})
}

// skewedClock is a clock off by a constant: a machine whose wall clock is
// wrong (its monotonic reading, which deadlines are measured with, is
// not).
type skewedClock struct{ off time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.off) }

// runFaultWorker runs EMBCACHE_OPS get-or-computes over EMBCACHE_KEYS keys.
// A worker that cannot reach the store writes one worker-wide error line
// (key -1): the harness takes it for setup trouble.
func runFaultWorker() int {
	h := &histWriter{enc: json.NewEncoder(os.Stdout), w: os.Getenv("EMBCACHE_WORKER_NAME")}
	keys, _ := strconv.Atoi(os.Getenv("EMBCACHE_KEYS"))
	ops, _ := strconv.Atoi(os.Getenv("EMBCACHE_OPS"))
	seed, _ := strconv.ParseUint(os.Getenv("EMBCACHE_SEED"), 10, 64)
	c, nc, err := connectFaultWorker(h)
	if err != nil {
		h.emit("error", -1, 0, false, err.Error())
		return 1
	}
	defer nc.Close()
	defer c.Close()
	h.emit("ready", -1, 0, true, "")
	rng := rand.New(rand.NewPCG(seed, 11))
	ids := rand.New(rand.NewPCG(seed, 13))
	for i := range ops {
		k := rng.IntN(keys)
		req := fmt.Sprint("op-", i)
		h.begin()
		if !c.Stats().Events {
			// The request began before the Cache's event link was up: a
			// pull it makes is computed unshared if the link comes up
			// meanwhile (its invalidations heard cannot be compared).
			h.emit("unlinked", k, 0, true, "")
		}
		v, path, err := c.GetOrComputePath(context.Background(), req, faultRef(k), func(context.Context) (*payload.Value, error) {
			id := ids.Uint64() | 1 // never 0: 0 is "no compute"
			h.computing(k, id)
			time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond) // the encoder's time on the GPU
			h.emit("compute-end", k, 0, true, "")
			return faultValue(k, id), nil
		})
		if err != nil {
			h.emit("error", k, 0, false, err.Error())
			time.Sleep(50 * time.Millisecond)
			continue
		}
		id := computeID(v)
		h.line(hist{Ev: "served", Key: k, OK: sum(v) == sum(faultValue(k, id)), Note: path.String(), ID: id})
		c.Release(req)
	}
	h.emit("done", -1, 0, true, "")
	return 0
}

// connectFaultWorker opens the worker's Cache and its connection,
// retrying while the cluster elects (readyTimeout at most). The schedule
// sets its mode (EMBCACHE_TENANT_MODE: the Cache serves its tenants
// only, as under tenant credentials) and its clock (EMBCACHE_SKEW).
func connectFaultWorker(h *histWriter) (*coordinator.Cache, *nats.Conn, error) {
	store, err := shm.Open(os.Getenv("EMBCACHE_SHM"), shm.WithNode("itest-node"))
	if err != nil {
		return nil, nil, err
	}
	skew, err := time.ParseDuration(os.Getenv("EMBCACHE_SKEW"))
	if err != nil {
		return nil, nil, fmt.Errorf("EMBCACHE_SKEW: %w", err)
	}
	nc, err := nats.Connect(os.Getenv("EMBCACHE_NATS"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, nil, err
	}
	plane, err := payload.NewRouter("itest-node", payload.TransportShm, loggedPuts{store, h}, payload.WithNodeStore(store))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	clock := skewedClock{skew}
	opts := []coordinator.Option{coordinator.WithMode(coordinator.ModeStrict),
		coordinator.WithReplicas(3), coordinator.WithPayload(plane),
		coordinator.WithNode("itest-node"), coordinator.WithLeaseTTL(time.Second), coordinator.WithOpTimeout(time.Second),
		coordinator.WithComputeTimeout(20 * time.Second), coordinator.WithObserver(h), coordinator.WithEvents(0),
		coordinator.WithClock(clock), coordinator.WithLocalCache(localcache.Budget{Clock: clock})}
	if os.Getenv("EMBCACHE_TENANT_MODE") == "1" {
		opts = append(opts, coordinator.WithTenants(faultTenants...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var c *coordinator.Cache
	err = retry(ctx, func() (err error) {
		c, err = coordinator.New(ctx, nc, opts...)
		return err
	})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc, nil
}
