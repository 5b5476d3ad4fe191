package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/embcache/embcache/cmd/embcache/internal/demo"
	"github.com/spf13/cobra"
)

func newLoadgen() *cobra.Command {
	var c demo.LoadConfig
	var prefills string
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
			if c.Encoder == "" || prefills == "" {
				return usagef("--encoder and --prefill are required")
			}
			if c.Unique < 1 || c.Unique > c.Requests {
				return usagef("need 1 <= --unique <= --requests")
			}
			c.Prefills = strings.Split(prefills, ",")
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			r, err := demo.Load(ctx, c, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := writeJSON(cmd.OutOrStdout(), r); err != nil {
				return err
			}
			if !r.ForwardsOK {
				return fmt.Errorf("%d encoder forwards for %d unique inputs (%d leases lost)", r.EncoderForwards, c.Unique, r.LeasesLost)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Encoder, "encoder", "", "base URL of the encoder worker")
	f.StringVar(&prefills, "prefill", "", "base URLs of the prefill workers, comma-separated")
	f.IntVar(&c.Requests, "requests", 200, "requests")
	f.IntVar(&c.Unique, "unique", 40, "distinct inputs")
	f.Float64Var(&c.Zipf, "zipf", 1.1, "Zipf exponent (> 1)")
	f.IntVar(&c.Concurrency, "concurrency", 8, "requests in flight")
	f.Uint64Var(&c.Seed, "seed", 1, "workload seed")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long")
	return cmd
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
