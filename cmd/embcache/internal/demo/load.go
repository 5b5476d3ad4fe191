package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/embcache/embcache/internal/workload"
)

// LoadConfig is one Load: the workload of Config, sent over HTTP to workers
// started with --listen.
type LoadConfig struct {
	Encoder     string   // base URL of the encoder worker
	Prefills    []string // base URLs of the prefill workers, taken round robin
	Requests    int
	Unique      int
	Zipf        float64
	Concurrency int
	Seed        uint64
}

// LoadReport is what Load measured.
type LoadReport struct {
	Requests        int  `json:"requests"`
	UniqueInputs    int  `json:"unique_inputs"`
	Retries         int  `json:"retries"`
	EncoderForwards int  `json:"encoder_forwards"` // summed over the workers' own counts, this run's
	LeasesLost      int  `json:"leases_lost"`      // leases the fencing took from a computing worker (faults)
	ForwardsExact   bool `json:"forwards_equal_unique_inputs"`
	// ForwardsOK: forwards == unique inputs, but for at most one extra
	// forward per lease lost in a fault (a NATS election that outlasts the
	// lease TTL lets another worker take the key over; the fencing then
	// refuses the first holder's commit, so no value is served twice).
	ForwardsOK bool `json:"forwards_ok"`
	// WarmStart: a worker had computed before this run (its counts are
	// subtracted; cached inputs are not computed again).
	WarmStart bool           `json:"warm_start"`
	Paths     map[string]int `json:"paths"`
	Seconds   float64        `json:"seconds"`
}

// Load sends each request to the encoder worker and then to a prefill
// worker, retrying a failed request every 200ms until ctx ends, and sums
// the workers' own forward counts.
func Load(ctx context.Context, c LoadConfig, progress io.Writer) (*LoadReport, error) {
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections() // no keep-alive outlives the load
	r := &LoadReport{Requests: c.Requests, UniqueInputs: c.Unique, Paths: map[string]int{}}
	// The workers count over their lifetime: this run's figures are the
	// change over it (a second run reported the first's forwards).
	before, err := workerCounts(ctx, client, c)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	start := time.Now()
	err = drive(workload.Requests(c.Requests, c.Unique, c.Zipf, c.Seed), c.Concurrency, progress, "loadgen",
		func(id, image int) error {
			for _, base := range []string{c.Encoder, c.Prefills[id%len(c.Prefills)]} {
				for {
					res, err := post(ctx, client, base, Request{ID: id, Image: image, Cache: true})
					mu.Lock()
					if err == nil {
						r.Paths[res.Path]++
					} else {
						r.Retries++
					}
					mu.Unlock()
					if err == nil {
						break
					}
					select {
					case <-ctx.Done():
						return fmt.Errorf("%s: %w (last error: %w)", base, ctx.Err(), err)
					case <-time.After(200 * time.Millisecond):
					}
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	r.Seconds = time.Since(start).Seconds()
	after, err := workerCounts(ctx, client, c)
	if err != nil {
		return nil, err
	}
	for i := range after {
		d := after[i].sub(before[i])
		r.EncoderForwards += d.forwards
		r.LeasesLost += d.lost
	}
	r.WarmStart = slices.ContainsFunc(before, func(w workerCount) bool { return w.forwards > 0 })
	r.ForwardsExact = r.EncoderForwards == c.Unique
	// A warm cluster may hold inputs already: it computes no more than the
	// unique inputs, maybe fewer.
	r.ForwardsOK = (r.WarmStart || r.EncoderForwards >= c.Unique) && r.EncoderForwards <= c.Unique+r.LeasesLost
	return r, nil
}

// workerCount is one worker's lifetime counters.
type workerCount struct{ forwards, lost int }

// sub is w's change since before; a worker that restarted (its counts
// fell) counts from zero.
func (w workerCount) sub(before workerCount) workerCount {
	if w.forwards < before.forwards || w.lost < before.lost {
		return w
	}
	return workerCount{w.forwards - before.forwards, w.lost - before.lost}
}

// workerCounts reads the encoder's and each prefill worker's counters.
func workerCounts(ctx context.Context, client *http.Client, c LoadConfig) ([]workerCount, error) {
	var out []workerCount
	for _, base := range append([]string{c.Encoder}, c.Prefills...) {
		s, err := FetchStats(ctx, client, base)
		if err != nil {
			return nil, err
		}
		out = append(out, workerCount{s.Forwards, int(s.Cache.LeasesLost + s.Cache.CommitsRefused)})
	}
	return out, nil
}

func post(ctx context.Context, c *http.Client, base string, r Request) (Result, error) {
	body, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/request", bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Result{}, fmt.Errorf("%s: %s %s", base, resp.Status, msg)
	}
	var res Result
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return res, err
	}
	if res.Err != "" {
		return res, fmt.Errorf("%s: %s", base, res.Err)
	}
	return res, nil
}

// FetchStats asks the worker serving HTTP at base (http://host:port) for
// its counters (GET /v1/stats).
func FetchStats(ctx context.Context, c *http.Client, base string) (WorkerStats, error) {
	var s WorkerStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/stats", nil)
	if err != nil {
		return s, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s: %s", base, resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}
