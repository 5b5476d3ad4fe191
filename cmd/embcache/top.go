package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/embcache/embcache/live"
	"github.com/gdamore/tcell/v2"
	"github.com/spf13/cobra"
)

func newTop() *cobra.Command {
	var cf connFlags
	var tenant string
	var once, asJSON, leases bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Watch the cluster live: requests, hit ratio, forwards saved, leases computing, the reconciler, every process",
		Long: "top listens to the summaries every embcache process announces (every 2 s by default; docs/protocol.md 5)\n" +
			"and shows the cluster's totals, the leases computing now (oldest first), the active reconciler and\n" +
			"its lag, and one row per process, refreshed every second. Keys: s and S change the sort column,\n" +
			"r reverses it, q quits. --once prints one snapshot (--json: as JSON) after --wait and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tenantFlag(tenant, false); err != nil {
				return err
			}
			if asJSON && !once {
				return usagef("--json goes with --once")
			}
			if wait <= 0 {
				return usagef("--wait %v: want a duration above 0", wait)
			}
			nc, _, err := cf.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			var opts []live.AggregatorOption
			if tenant == "" {
				// A tenant's user may not read the reconciler's consumer.
				opts = append(opts, live.WithReconcilerLag())
			}
			if leases {
				opts = append(opts, live.WithLeases())
			}
			if tenant != "" {
				opts = append(opts, live.WithTenantOnly(tenant))
			}
			agg, err := live.NewAggregator(nc, opts...)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- agg.Run(ctx)
				cancel() // a subscription that failed ends the view, not an empty screen
			}()
			if once {
				err = topOnce(ctx, agg, wait, asJSON, nc.ConnectedUrlRedacted(), cmd.OutOrStdout())
			} else {
				err = topScreen(ctx, agg, nc.ConnectedUrlRedacted())
			}
			cancel()
			if rerr := <-done; rerr != nil && !errors.Is(rerr, context.Canceled) {
				err = fmt.Errorf("top: %w", rerr) // what ended the view
			}
			return err
		},
	}
	cf.register(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "only this tenant's processes and leases (a NATS user that may see no other's)")
	f.BoolVar(&once, "once", false, "print one snapshot and exit")
	f.BoolVar(&asJSON, "json", false, "with --once: print the snapshot as JSON")
	f.BoolVar(&leases, "leases", true, "follow the leases computing now: every record write of the cluster reaches top (docs/scaling.md 5); --leases=false for a large cluster")
	f.DurationVar(&wait, "wait", 5*time.Second, "with --once: listen this long first (two summary intervals give every process's rates)")
	return cmd
}

// topOnce listens for wait and prints what it heard.
func topOnce(ctx context.Context, agg *live.Aggregator, wait time.Duration, asJSON bool, source string, w io.Writer) error {
	select {
	case <-ctx.Done():
	case <-time.After(wait):
	}
	v := agg.View()
	if asJSON {
		return writeJSON(w, v)
	}
	m := newTopModel(source)
	m.view = v
	for _, l := range m.lines(20) {
		fmt.Fprintln(w, l.text)
	}
	return nil
}

// topScreen draws the view full-screen, once a second and at each key,
// until q, Ctrl-C or ctx ends.
func topScreen(ctx context.Context, agg *live.Aggregator, source string) error {
	s, err := tcell.NewScreen()
	if err != nil {
		return fmt.Errorf("top needs a terminal (--once prints without one): %w", err)
	}
	if err := s.Init(); err != nil {
		return fmt.Errorf("top needs a terminal (--once prints without one): %w", err)
	}
	defer s.Fini()
	events := make(chan tcell.Event, 16)
	quit := make(chan struct{})
	defer close(quit)
	go s.ChannelEvents(events, quit)
	m := newTopModel(source)
	t := time.NewTicker(topRefresh)
	defer t.Stop()
	for {
		m.view = agg.View()
		drawTop(s, m)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case ev := <-events:
			switch ev := ev.(type) {
			case *tcell.EventKey:
				if ev.Key() == tcell.KeyCtrlC || ev.Key() == tcell.KeyEscape || (ev.Key() == tcell.KeyRune && m.key(ev.Rune())) {
					return nil
				}
			case *tcell.EventResize:
				s.Sync()
			}
		}
	}
}

// drawTop puts the model's lines on the screen, as many as fit.
func drawTop(s tcell.Screen, m *topModel) {
	s.Clear()
	_, height := s.Size()
	bold := tcell.StyleDefault.Bold(true)
	// The leases get what the processes leave of the screen, at least 3.
	lines := m.lines(max(3, height-len(m.view.Processes)-16))
	for y, l := range lines {
		if y >= height {
			break
		}
		style := tcell.StyleDefault
		if l.header {
			style = bold
		}
		s.PutStrStyled(0, y, l.text, style)
	}
	s.Show()
}
