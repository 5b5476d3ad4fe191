package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
	"github.com/spf13/cobra"
)

// workRequest asks a worker for the embedding of one demo input.
type workRequest struct {
	ID    int  `json:"id"`
	Image int  `json:"image"`
	Cache bool `json:"cache"` // false: encode every time (the baseline)
}

// workResult is a worker's answer.
type workResult struct {
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
func (r *workResult) fail(err error) {
	r.Err, r.Path, r.status = err.Error(), "failed", http.StatusInternalServerError
	if errors.Is(err, coordinator.ErrStoreUnavailable) {
		r.status = http.StatusServiceUnavailable
	}
}

// workerStats is what GET /v1/stats answers.
type workerStats struct {
	Role     string            `json:"role"`
	Node     string            `json:"node"`
	Forwards int               `json:"forwards"`
	Requests int64             `json:"requests"`
	Cache    coordinator.Stats `json:"cache"`
}

type worker struct {
	role     string
	node     string
	cache    *coordinator.Cache
	enc      *workload.Encoder
	keyer    *cachekey.Keyer
	requests atomic.Int64
	nextReq  atomic.Int64
}

func newWorker() *cobra.Command {
	var nf nodeFlags
	var role, listen, metricsListen string
	var embedMB float64
	var encodeMS int
	var verbose bool
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run an encoder or prefill worker (what demo and docker-compose run)",
		Long: "A worker answers requests for the embedding of demo input N through the cache.\n" +
			"Requests come as JSON lines on stdin (answers on stdout), or over HTTP with --listen:\n" +
			"POST /v1/request {\"id\":1,\"image\":7,\"cache\":true}, GET /v1/stats, GET /healthz.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if role != "encoder" && role != "prefill" {
				return usagef("--role must be encoder or prefill, not %q", role)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger := newLogger(cmd.ErrOrStderr(), verbose)
			tel, err := startTelemetry(ctx, "embcache-worker", metricsListen)
			if err != nil {
				return err
			}
			defer tel.shutdown()
			if tel.addr != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "embcache worker: metrics at http://%s/metrics\n", tel.addr)
			}
			n, err := nf.start(ctx, logger, tel)
			if err != nil {
				return err
			}
			defer n.Close()
			keyer, err := cachekey.NewKeyer(workload.Config("demo"))
			if err != nil {
				return err
			}
			w := &worker{role: role, node: n.Name(), cache: n.Cache(), keyer: keyer,
				enc: &workload.Encoder{Bytes: int(embedMB * (1 << 20)), Wait: time.Duration(encodeMS) * time.Millisecond}}
			if listen != "" {
				return w.serveHTTP(ctx, listen)
			}
			return w.serveLines(ctx, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	nf.register(cmd.Flags())
	cmd.Flags().StringVar(&role, "role", "prefill", "encoder or prefill")
	cmd.Flags().StringVar(&listen, "listen", "", "answer requests over HTTP on this address instead of stdin")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address")
	cmd.Flags().Float64Var(&embedMB, "embed-mb", 8, "embedding size in MiB")
	cmd.Flags().IntVar(&encodeMS, "encode-ms", 30, "milliseconds each forward waits, standing for GPU time")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log more")
	return cmd
}

// handle answers one request.
func (w *worker) handle(ctx context.Context, r workRequest) workResult {
	w.requests.Add(1)
	res := workResult{ID: r.ID, Image: r.Image, Role: w.role}
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

// serveLines answers JSON-line requests from in until it closes.
func (w *worker) serveLines(ctx context.Context, in io.Reader, out io.Writer) error {
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
		var r workRequest
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			emit(workResult{ID: -1, Err: "bad request: " + err.Error()})
			continue
		}
		if r.ID < 0 { // the driver asks for stats
			wg.Wait()
			emit(w.stats())
			continue
		}
		wg.Go(func() { emit(w.handle(ctx, r)) })
	}
	wg.Wait()
	return sc.Err()
}

func (w *worker) stats() workerStats {
	return workerStats{Role: w.role, Node: w.node, Forwards: w.enc.Forwards(),
		Requests: w.requests.Load(), Cache: w.cache.Stats()}
}

// serveHTTP answers requests over HTTP until ctx ends.
func (w *worker) serveHTTP(ctx context.Context, addr string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/request", func(rw http.ResponseWriter, req *http.Request) {
		var r workRequest
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<16)).Decode(&r); err != nil {
			http.Error(rw, "bad request: "+err.Error(), http.StatusBadRequest)
			return
		}
		res := w.handle(req.Context(), r)
		rw.Header().Set("Content-Type", "application/json")
		if res.status != 0 {
			rw.WriteHeader(res.status)
		}
		json.NewEncoder(rw).Encode(res)
	})
	mux.HandleFunc("GET /v1/stats", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(w.stats())
	})
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.cache.Stats().StoreReachable {
			http.Error(rw, "store unreachable", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(rw, "ok\n")
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	fmt.Fprintln(os.Stderr, "embcache worker: role", w.role, "listening on", l.Addr().String())
	if err := srv.Serve(l); err != http.ErrServerClosed {
		return err
	}
	return nil
}
