package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/embcache/embcache/internal/workload"
	"github.com/spf13/cobra"
)

// loadReport is what loadgen prints.
type loadReport struct {
	Requests        int  `json:"requests"`
	UniqueInputs    int  `json:"unique_inputs"`
	Retries         int  `json:"retries"`
	EncoderForwards int  `json:"encoder_forwards"` // summed over the workers' own counts
	LeasesLost      int  `json:"leases_lost"`      // leases the fencing took from a computing worker (faults)
	ForwardsExact   bool `json:"forwards_equal_unique_inputs"`
	// ForwardsOK: forwards == unique inputs, but for at most one extra
	// forward per lease lost in a fault (a NATS election that outlasts the
	// lease TTL lets another worker take the key over; the fencing then
	// refuses the first holder's commit, so no value is served twice).
	ForwardsOK bool           `json:"forwards_ok"`
	Paths      map[string]int `json:"paths"`
	Seconds    float64        `json:"seconds"`
}

func newLoadgen() *cobra.Command {
	var encoder, prefills string
	var requests, unique, concurrency int
	var zipf float64
	var seed uint64
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "loadgen --encoder URL --prefill URL,URL,..",
		Short: "Drive workers started with --listen: the docker-compose workload",
		Long: "loadgen sends each request to the encoder worker and then to a prefill worker (round robin),\n" +
			"retrying failed requests until --timeout, and finally sums the workers' own forward counts.\n" +
			"It exits 1 unless every request succeeded and forwards == unique inputs (plus at most one\n" +
			"per lease lost in a fault, which the fencing kept from being served twice).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if encoder == "" || prefills == "" {
				return usagef("--encoder and --prefill are required")
			}
			if unique < 1 || unique > requests {
				return usagef("need 1 <= --unique <= --requests")
			}
			targets := strings.Split(prefills, ",")
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			client := &http.Client{Timeout: 30 * time.Second}
			r := &loadReport{Requests: requests, UniqueInputs: unique, Paths: map[string]int{}}
			var mu sync.Mutex
			start := time.Now()
			err := drive(workload.Requests(requests, unique, zipf, seed), concurrency, cmd.ErrOrStderr(), "loadgen",
				func(id, image int) error {
					for _, base := range []string{encoder, targets[id%len(targets)]} {
						for {
							res, err := post(ctx, client, base, workRequest{ID: id, Image: image, Cache: true})
							if err == nil {
								mu.Lock()
								r.Paths[res.Path]++
								mu.Unlock()
								break
							}
							mu.Lock()
							r.Retries++
							mu.Unlock()
							select {
							case <-ctx.Done():
								return fmt.Errorf("%s: %w (last error: %v)", base, ctx.Err(), err)
							case <-time.After(200 * time.Millisecond):
							}
						}
					}
					return nil
				})
			if err != nil {
				return err
			}
			r.Seconds = time.Since(start).Seconds()
			for _, base := range append([]string{encoder}, targets...) {
				var s workerStats
				if err := getJSON(ctx, client, base+"/v1/stats", &s); err != nil {
					return err
				}
				r.EncoderForwards += s.Forwards
				r.LeasesLost += int(s.Cache.LeasesLost + s.Cache.CommitsRefused)
			}
			r.ForwardsExact = r.EncoderForwards == unique
			r.ForwardsOK = r.EncoderForwards >= unique && r.EncoderForwards <= unique+r.LeasesLost
			if err := writeJSON(cmd.OutOrStdout(), r); err != nil {
				return err
			}
			if !r.ForwardsOK {
				return fmt.Errorf("%d encoder forwards for %d unique inputs (%d leases lost)", r.EncoderForwards, unique, r.LeasesLost)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&encoder, "encoder", "", "base URL of the encoder worker")
	f.StringVar(&prefills, "prefill", "", "base URLs of the prefill workers, comma-separated")
	f.IntVar(&requests, "requests", 200, "requests")
	f.IntVar(&unique, "unique", 40, "distinct inputs")
	f.Float64Var(&zipf, "zipf", 1.1, "Zipf exponent (> 1)")
	f.IntVar(&concurrency, "concurrency", 8, "requests in flight")
	f.Uint64Var(&seed, "seed", 1, "workload seed")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	return cmd
}

func post(ctx context.Context, c *http.Client, base string, r workRequest) (workResult, error) {
	body, _ := json.Marshal(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/request", bytes.NewReader(body))
	if err != nil {
		return workResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return workResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return workResult{}, fmt.Errorf("%s: %s %s", base, resp.Status, msg)
	}
	var res workResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return res, err
	}
	if res.Err != "" {
		return res, fmt.Errorf("%s: %s", base, res.Err)
	}
	return res, nil
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func newHealth() *cobra.Command {
	var cf connFlags
	var httpURL string
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Exit 0 if NATS with JetStream (or, with --http, a worker) answers: for healthchecks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			if httpURL != "" {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, httpURL, nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: %s", httpURL, resp.Status)
				}
				return nil
			}
			nc, js, err := cf.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			if _, err := js.AccountInfo(ctx); err != nil {
				return fmt.Errorf("JetStream: %w", err)
			}
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&httpURL, "http", "", "check this URL answers 200 instead")
	return cmd
}
