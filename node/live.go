package node

import (
	"context"

	"github.com/embcache/embcache/live"
)

// startSummaries publishes the node's live summary (package live) until
// Close: its Cache's counters and its reconciler's. A summary that cannot
// be sent is counted and skipped; requests never wait for one.
func (n *Node) startSummaries() error {
	o := &n.opts
	if o.SummaryInterval < 0 {
		return nil
	}
	opts := []live.PublisherOption{live.WithLogger(o.Logger)}
	if o.Role != "" {
		opts = append(opts, live.WithRole(o.Role))
	}
	if o.SummaryInterval > 0 {
		opts = append(opts, live.WithInterval(o.SummaryInterval))
	}
	if o.SummaryTenant != "" {
		opts = append(opts, live.WithTenant(o.SummaryTenant))
	}
	if o.Version != "" {
		opts = append(opts, live.WithVersion(o.Version))
	}
	cache, rec, add := n.cache, n.rec, o.SummaryAdd
	pub, err := live.NewPublisher(n.nc, o.Name, func() live.Summary {
		var s live.Summary
		if cache != nil {
			s = live.CacheFigures(cache.Stats())
		}
		if rec != nil {
			s.Reconciler = live.ReconcilerOf(rec.Stats())
		}
		if add != nil {
			add(&s)
		}
		return s
	}, opts...)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	n.summaries, n.stopSummaries, n.summariesDone = pub, stop, make(chan struct{})
	go func() {
		defer close(n.summariesDone)
		pub.Run(ctx)
	}()
	return nil
}

// Summaries is the node's live summary publisher (nil before Start, and
// with a negative SummaryInterval).
func (n *Node) Summaries() *live.Publisher { return n.summaries }
