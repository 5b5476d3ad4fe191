package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
)

// Request asks a worker for the embedding of one demo input.
type Request struct {
	ID    int  `json:"id"`
	Image int  `json:"image"`
	Cache bool `json:"cache"` // false: encode every time (the baseline)
}

// Result is a worker's answer.
type Result struct {
	ID      int     `json:"id"`
	Image   int     `json:"image"`
	Role    string  `json:"role"`
	Path    string  `json:"path"`
	Millis  float64 `json:"ms"`
	Forward bool    `json:"forward"`
	Bytes   int64   `json:"bytes"` // payload bytes pulled from another process
	Err     string  `json:"err,omitempty"`
	status  int     // the HTTP status of a failed request (0: 200)
}

// fail records err as the request's outcome: path "failed", and the HTTP
// status it answers (503 when the store is down, 500 otherwise).
func (r *Result) fail(err error) {
	r.Err, r.Path, r.status = err.Error(), "failed", http.StatusInternalServerError
	if errors.Is(err, coordinator.ErrStoreUnavailable) {
		r.status = http.StatusServiceUnavailable
	}
}

// WorkerStats is what a worker answers GET /v1/stats (or a negative ID) with.
type WorkerStats struct {
	Role     string            `json:"role"`
	Node     string            `json:"node"`
	Forwards int               `json:"forwards"`
	Requests int64             `json:"requests"`
	Cache    coordinator.Stats `json:"cache"`
}

// Worker answers Requests through a Cache, as an encoder or a prefill
// stage: both ask for the same embeddings; the encoder comes first.
type Worker struct {
	role     string
	node     string
	cache    *coordinator.Cache
	enc      *workload.Encoder
	keyer    *cachekey.Keyer
	requests atomic.Int64
	nextReq  atomic.Int64
}

// NewWorker returns a worker of role on node's cache whose encoder makes
// embeddings of embedBytes and waits encodeWait a forward.
func NewWorker(role, node string, cache *coordinator.Cache, embedBytes int, encodeWait time.Duration) (*Worker, error) {
	keyer, err := cachekey.NewKeyer(workload.Config("demo"))
	if err != nil {
		return nil, err
	}
	return &Worker{role: role, node: node, cache: cache, keyer: keyer,
		enc: &workload.Encoder{Bytes: embedBytes, Wait: encodeWait}}, nil
}

// Handle answers one request.
func (w *Worker) Handle(ctx context.Context, r Request) Result {
	w.requests.Add(1)
	res := Result{ID: r.ID, Image: r.Image, Role: w.role}
	input := workload.Image(r.Image)
	start := time.Now()
	if !r.Cache {
		_, err := w.enc.Encode(ctx, input)
		res.Path, res.Forward, res.Millis = "no-cache", true, ms(time.Since(start))
		if err != nil {
			res.fail(err)
		}
		return res
	}
	key, err := w.keyer.RawBytes(input)
	if err != nil {
		res.fail(err)
		return res
	}
	req := fmt.Sprintf("%s-%d-%d", w.role, r.ID, w.nextReq.Add(1))
	forwarded := false
	v, path, err := w.cache.GetOrComputePath(ctx, req, coordinator.NewRef(w.keyer.Config(), key),
		func(ctx context.Context) (*payload.Value, error) {
			forwarded = true
			return w.enc.Encode(ctx, input)
		})
	res.Millis, res.Path, res.Forward = ms(time.Since(start)), path.String(), forwarded && path != coordinator.PathCoalesced
	if err != nil {
		res.fail(err)
		return res
	}
	if path == coordinator.PathRemoteHit || path == coordinator.PathWaited {
		res.Bytes = v.Size()
	}
	w.cache.Release(req) // the request is over: the RFC's cleanup_request
	return res
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Stats returns the worker's counts.
func (w *Worker) Stats() WorkerStats {
	return WorkerStats{Role: w.role, Node: w.node, Forwards: w.enc.Forwards(),
		Requests: w.requests.Load(), Cache: w.cache.Stats()}
}

// ServeLines answers JSON-line requests from in until it closes.
func (w *Worker) ServeLines(ctx context.Context, in io.Reader, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	emit := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(v)
	}
	emit(map[string]any{"ready": true, "role": w.role})
	sc := bufio.NewScanner(in)
	var wg sync.WaitGroup
	for sc.Scan() {
		var r Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			emit(Result{ID: -1, Err: "bad request: " + err.Error()})
			continue
		}
		if r.ID < 0 { // the driver asks for stats
			wg.Wait()
			emit(w.Stats())
			continue
		}
		wg.Go(func() { emit(w.Handle(ctx, r)) })
	}
	wg.Wait()
	return sc.Err()
}

// ServeHTTP answers requests on l until ctx ends.
func (w *Worker) ServeHTTP(ctx context.Context, l net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/request", func(rw http.ResponseWriter, req *http.Request) {
		var r Request
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&r); err != nil {
			http.Error(rw, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		res := w.Handle(req.Context(), r)
		rw.Header().Set("Content-Type", "application/json")
		if res.status != 0 {
			rw.WriteHeader(res.status)
		}
		json.NewEncoder(rw).Encode(res)
	})
	mux.HandleFunc("GET /v1/stats", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(w.Stats())
	})
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.cache.Stats().StoreReachable {
			http.Error(rw, "store unreachable", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(rw, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != http.ErrServerClosed {
		return err
	}
	return nil
}
