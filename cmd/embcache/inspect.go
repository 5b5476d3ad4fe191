package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
	"github.com/embcache/embcache/events"
	"github.com/embcache/embcache/internal/inspect"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/reconciler"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// connFlags say how inspection commands reach NATS: the connection's
// flags, and how long to wait.
type connFlags struct {
	natsFlags
	timeout time.Duration
}

func (c *connFlags) register(fs *pflag.FlagSet) {
	c.natsFlags.register(fs)
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "how long to wait for NATS")
}

// tenantFlag checks a --tenant flag (required, or "" for every tenant):
// its error names the flag, not a preprocessing config.
func tenantFlag(tenant string, required bool) error {
	if tenant == "" && !required {
		return nil
	}
	if tenant == "" {
		return usagef("--tenant is required")
	}
	if err := cachekey.ValidateTenant(tenant); err != nil {
		_, why, _ := strings.Cut(err.Error(), "tenant: ")
		return usagef("--tenant %q: %s", tenant, why)
	}
	return nil
}

func (c *connFlags) connect() (*nats.Conn, jetstream.JetStream, error) {
	if strings.TrimSpace(c.url) == "" {
		return nil, nil, usagef("--nats is empty: give the NATS server URL(s)")
	}
	if c.timeout <= 0 {
		return nil, nil, usagef("--timeout %v: want a duration above 0", c.timeout)
	}
	conn, err := c.options()
	if err != nil {
		return nil, nil, err
	}
	opts := append([]nats.Option{nats.Name("embcache-cli"), nats.Timeout(c.timeout)}, conn...)
	nc, err := nats.Connect(c.url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w (is embcache serve running? set --nats)", c.url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// bucket connects and binds the lease bucket; close releases both.
func (c *connFlags) bucket(ctx context.Context) (b *lease.Bucket, close func(), err error) {
	nc, _, err := c.connect()
	if err != nil {
		return nil, nil, err
	}
	if b, err = inspect.Bucket(ctx, nc); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return b, nc.Close, nil
}

func newLeases() *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{Use: "leases", Short: "List and show lease records"}
	cf.register(cmd.PersistentFlags())
	cmd.AddCommand(newLeasesLs(&cf), newLeasesGet(&cf))
	return cmd
}

func newLeasesLs(cf *connFlags) *cobra.Command {
	var tenant string
	var limit int
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List lease and record keys (<tenant>.<keyhex>; invalidation tombstones <tenant>.inv.<keyhex>)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tenantFlag(tenant, false); err != nil {
				return err
			}
			if limit < 0 {
				return usagef("--limit must be >= 0 (0: all), got %d", limit)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			kv, closeConn, err := cf.bucket(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			keys, total, err := inspect.Keys(ctx, kv, tenant, limit)
			if err != nil {
				return err
			}
			for _, k := range keys {
				fmt.Fprintln(cmd.OutOrStdout(), k)
			}
			if total > len(keys) {
				fmt.Fprintf(cmd.ErrOrStderr(), "(the first %d of %d keys; --limit 0 lists them all)\n", len(keys), total)
			}
			return nil
		},
	}
	ls.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	ls.Flags().IntVar(&limit, "limit", 1000, "list the first this many keys in order (0: all); the count goes to stderr")
	return ls
}

func newLeasesGet(cf *connFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get <tenant>.<keyhex> | <tenant>.inv.<keyhex> | " + reconciler.ElectionKey + " | " + reconciler.ProgressKey,
		Short: "Print a lease record, an invalidation's tombstone or a reconciler key (JSON)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The reconcilers' keys, which leases ls lists too: the
			// election's lease record, and the progress mark (not a record).
			system := args[0] == reconciler.ElectionKey || args[0] == reconciler.ProgressKey
			if !system {
				t, k, ok := strings.Cut(args[0], ".")
				if !ok || cachekey.ValidateTenant(t) != nil {
					return usagef("key %q is not <tenant>.<keyhex>, %s or %s", args[0], reconciler.ElectionKey, reconciler.ProgressKey)
				}
				k = strings.TrimPrefix(k, "inv.") // a tombstone (docs/protocol.md 4.4)
				if _, err := cachekey.Parse(k); err != nil {
					return usageError{err}
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			kv, closeConn, err := cf.bucket(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			value, rev, err := inspect.Record(ctx, kv, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", value)
			if lease.IsTombstoneKey(args[0]) && len(kv.Shards()) > 1 {
				// One copy per shard, each at its shard's revision: the one a
				// record is compared with is its own shard's.
				revs, err := inspect.TombstoneRevisions(ctx, kv, args[0])
				if err != nil {
					return err
				}
				for shard, r := range revs {
					fmt.Fprintf(cmd.ErrOrStderr(), "shard %d (%s): revision %d\n", shard, lease.ShardName(kv.Name(), shard), r)
				}
			}
			if args[0] == reconciler.ProgressKey {
				return nil
			}
			if _, err := lease.DecodeRecord(args[0], value); err != nil {
				// Printed as it is (what an operator needs to see), and an
				// error: the processes cannot read it either.
				return fmt.Errorf("%s (revision %d) does not decode: %w", args[0], rev, err)
			}
			return nil
		},
	}
}

func newEvents() *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{Use: "events", Short: "Follow the event stream"}
	cf.register(cmd.PersistentFlags())
	var kind, tenant string
	var fromStart bool
	var count int
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print events as JSON lines (decoded from msgpack) until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 0 {
				return usagef("--count must be >= 0 (0: until interrupted), got %d", count)
			}
			opts := events.SubscribeOptions{New: !fromStart, Logger: newLogger(cmd.ErrOrStderr(), false)}
			if kind != "" {
				k, err := events.ParseKind(kind)
				if err != nil { // a flag, not an event: not ParseKind's "bad event"
					names := make([]string, 0, len(events.Kinds()))
					for _, k := range events.Kinds() {
						names = append(names, k.String())
					}
					return usageError{fmt.Errorf("--kind %q is not an event kind (one of %s)", kind, strings.Join(names, ", "))}
				}
				opts.Kinds = []events.Kind{k}
			}
			if err := tenantFlag(tenant, false); err != nil {
				return err
			}
			if tenant != "" {
				opts.Tenants = []string{tenant}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return tailEvents(ctx, &cf, opts, count, cmd.OutOrStdout())
		},
	}
	tail.Flags().StringVar(&kind, "kind", "", "only this kind: published, touched, evicted, abandoned, invalidated")
	tail.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	tail.Flags().BoolVar(&fromStart, "from-start", false, "replay the stream from its start")
	tail.Flags().IntVar(&count, "count", 0, "stop after this many events (0: until interrupted)")
	cmd.AddCommand(tail)
	return cmd
}

// tailEvents prints events as JSON lines until ctx ends or count (> 0) are printed.
func tailEvents(ctx context.Context, cf *connFlags, opts events.SubscribeOptions, count int, w io.Writer) error {
	nc, js, err := cf.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	return inspect.Tail(ctx, js, opts, count, func(e events.Event) { writeJSONLine(w, inspect.EventLine(e)) })
}

func newStats() *cobra.Command {
	var cf connFlags
	var asJSON, live bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show the bucket's and the stream's sizes (--live: and count the live values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := cf.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			// A replay takes as long as the stream is big: it is bounded by
			// Ctrl-C, not by --timeout. Without one, --timeout bounds the
			// whole (it bounded it at three times, one per kind of request).
			ctx, cancel := cmd.Context(), context.CancelFunc(func() {})
			if !live {
				ctx, cancel = context.WithTimeout(ctx, cf.timeout)
			}
			defer cancel()
			// What exists is printed; a bucket or stream not created yet
			// is then the error (exit 1), as is one that did not answer.
			sum, err := inspect.Summarize(ctx, js, live)
			if err != nil && !errors.Is(err, inspect.ErrNotCreated) {
				return err
			}
			if asJSON {
				if jerr := writeJSON(cmd.OutOrStdout(), sum); jerr != nil {
					return jerr
				}
				return err
			}
			w := cmd.OutOrStdout()
			if b := sum.Bucket; b != nil {
				fmt.Fprintf(w, "bucket   %s: %d messages (records, tombstones and markers), %d bytes, %d replicas", b.Name, b.Values, b.Bytes, b.Replicas)
				if b.Shards > 1 {
					fmt.Fprintf(w, ", %d shards", b.Shards)
				}
				fmt.Fprintln(w)
			}
			if e := sum.Events; e != nil {
				fmt.Fprintf(w, "events   %s: %d messages, %d bytes\n", e.Stream, e.Messages, e.Bytes)
				if sum.LiveValues != nil {
					fmt.Fprintf(w, "live     %d values (%d undecodable events skipped)\n", *sum.LiveValues, *sum.UndecodableEvents)
				}
			}
			return err
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&live, "live", false, "replay the event stream to count the live values (reads every event: slow on big streams)")
	return cmd
}

func newInvalidate() *cobra.Command {
	var cf connFlags
	var tenant, model string
	var epoch uint64
	var storeTTL time.Duration
	cmd := &cobra.Command{
		Use:   "invalidate --tenant T --model M --epoch E",
		Short: "Declare every value of a tenant, model and weight epoch stale",
		Long: "invalidate writes the invalidation's tombstone to the lease bucket (from then on no process\n" +
			"serves a value of that model and epoch computed before it, reconciler or not), then publishes\n" +
			"the invalidated event: workers drop their copies, and the reconciler removes the records and\n" +
			"payloads. Use it after updating a model's weights in place (docs/protocol.md 4.4).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tenantFlag(tenant, true); err != nil {
				return err
			}
			if model == "" || !cmd.Flags().Changed("epoch") {
				return usagef("--model and --epoch are required")
			}
			nc, _, err := cf.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			err = coordinator.Invalidate(ctx, nc, coordinator.Invalidation{Tenant: tenant, Model: model, Epoch: epoch,
				StoreTTL: storeTTL, Node: hostname(), Logger: newLogger(cmd.ErrOrStderr(), false)})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "invalidated tenant %s model %s epoch %d\n", tenant, model, epoch)
			return nil
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant")
	cmd.Flags().StringVar(&model, "model", "", "model id")
	cmd.Flags().Uint64Var(&epoch, "epoch", 0, "weight epoch whose values are stale")
	cmd.Flags().DurationVar(&storeTTL, "store-ttl", time.Hour, "the cluster's store TTL: the tombstone lives max(25h, 2 x this)")
	return cmd
}
