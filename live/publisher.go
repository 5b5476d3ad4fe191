package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/embcache/embcache/cachekey"
)

// DefaultInterval is how often a process publishes its summary unless
// told otherwise.
const DefaultInterval = 2 * time.Second

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Conn is what a Publisher sends with: a *nats.Conn.
type Conn interface {
	Publish(subject string, data []byte) error
}

// Source returns a process's counters: a Summary whose identity fields
// (v, node, id, role, tenant, pid, version, times, seq, unsent) the
// Publisher fills in. It is called on the Publisher's goroutine, never on
// a request's; keep it to reading counters.
type Source func() Summary

// Publisher announces one process's summary every interval.
type Publisher struct {
	nc       Conn
	src      Source
	subject  string
	identity Summary // the fields the Publisher sets
	interval time.Duration
	clock    Clock
	logger   *slog.Logger

	mu  sync.Mutex // serialises takes
	seq uint64     // guarded by mu

	sent, failed atomic.Uint64
	failedSaid   atomic.Bool // the first failure is logged, the rest counted
}

// PublisherOption configures a Publisher.
type PublisherOption func(*Publisher) error

// WithRole names what the process is (default RoleCache).
func WithRole(role string) PublisherOption {
	return func(p *Publisher) error {
		if role == "" {
			return fmt.Errorf("%w: empty role", ErrInvalidOption)
		}
		p.identity.Role = role
		return nil
	}
}

// WithTenant puts the summaries on the subjects of the one tenant the
// process serves (its NATS user may publish only those: the single-account
// layout, coordinator.WithTenants). Default: AllTenants.
func WithTenant(tenant string) PublisherOption {
	return func(p *Publisher) error {
		if err := cachekey.ValidateTenant(tenant); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		p.identity.Tenant = tenant
		return nil
	}
}

// WithInterval sets how often the summary goes (default DefaultInterval;
// at least 100ms).
func WithInterval(d time.Duration) PublisherOption {
	return func(p *Publisher) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("%w: interval %v (at least 100ms)", ErrInvalidOption, d)
		}
		p.interval = d
		return nil
	}
}

// WithVersion sets the version the summaries carry (the binary's).
func WithVersion(v string) PublisherOption {
	return func(p *Publisher) error { p.identity.Version = v; return nil }
}

// WithClock sets the clock the summaries' times are read from.
func WithClock(c Clock) PublisherOption {
	return func(p *Publisher) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		p.clock = c
		return nil
	}
}

// WithLogger sets where the first failure to publish is said (default
// slog.Default()).
func WithLogger(l *slog.Logger) PublisherOption {
	return func(p *Publisher) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		p.logger = l
		return nil
	}
}

// NewPublisher returns a Publisher of node's summaries, read from src,
// sent on nc. Run publishes them.
func NewPublisher(nc Conn, node string, src Source, opts ...PublisherOption) (*Publisher, error) {
	if nc == nil || src == nil {
		return nil, fmt.Errorf("%w: nil connection or source", ErrInvalidOption)
	}
	if node == "" {
		return nil, fmt.Errorf("%w: empty node name", ErrInvalidOption)
	}
	var id [8]byte
	rand.Read(id[:])
	p := &Publisher{nc: nc, src: src, interval: DefaultInterval, clock: systemClock{}, logger: slog.Default(),
		identity: Summary{V: Version, Node: node, ID: hex.EncodeToString(id[:]), Role: RoleCache, PID: os.Getpid()}}
	for _, opt := range opts {
		if err := opt(p); err != nil {
			return nil, err
		}
	}
	p.identity.Start = p.clock.Now().UnixNano()
	p.identity.Every = p.interval.Milliseconds()
	p.subject = Subject(p.identity.Tenant, node, p.identity.ID)
	return p, nil
}

// Subject is where the summaries go.
func (p *Publisher) Subject() string { return p.subject }

// ID is this run's id, in the subject and the summaries.
func (p *Publisher) ID() string { return p.identity.ID }

// Run publishes a summary at once, then every interval, and a last one
// when ctx ends (so a view's totals include what the process did last).
// It returns ctx's error.
func (p *Publisher) Run(ctx context.Context) error {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.Publish()
		select {
		case <-ctx.Done():
			p.Publish()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Take returns the summary that would be published now, and counts it
// as taken (its seq).
func (p *Publisher) Take() Summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked()
}

func (p *Publisher) takeLocked() Summary {
	s := p.src()
	id := p.identity
	s.V, s.Node, s.ID, s.Role, s.Tenant, s.PID, s.Version, s.Start, s.Every =
		id.V, id.Node, id.ID, id.Role, id.Tenant, id.PID, id.Version, id.Start, id.Every
	p.seq++
	s.Seq, s.Time, s.Unsent = p.seq, p.clock.Now().UnixNano(), p.failed.Load()
	return s
}

// Publish takes a summary and sends it. A summary that cannot be sent
// (the connection closed, its reconnect buffer full) is counted
// (Stats.Failed), its first failure logged, and the error returned; the
// next one carries the count. nats.go buffers a publish: it does not
// wait for the server, and a publish the server refuses (permissions)
// is reported to the connection's error handler, not here.
func (p *Publisher) Publish() error {
	s := p.Take()
	body, err := Encode(&s)
	if err == nil {
		// Not under mu: a summary sent out of order is one a reader
		// ignores (its seq), not one a taker waits for.
		err = p.nc.Publish(p.subject, body)
	}
	if err != nil {
		p.failed.Add(1)
		if !p.failedSaid.Swap(true) {
			p.logger.Warn("embcache: live summary not published (counted; requests are not affected)", "subject", p.subject, "err", err)
		}
		return err
	}
	p.sent.Add(1)
	return nil
}

// PublisherStats counts a Publisher's summaries.
type PublisherStats struct {
	Sent   uint64 // handed to the connection
	Failed uint64 // that could not be
}

// Stats returns the counts.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Sent: p.sent.Load(), Failed: p.failed.Load()}
}
