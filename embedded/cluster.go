package embedded

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is N embedded nodes routed to each other on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n nodes (n >= 1) with stores under dir/<name> and
// waits until JetStream can place a stream of n replicas (WaitJetStream).
//
// configure, if set, edits each node's options before it starts; it runs
// for i = 0..n-1 in that order, once per attempt. A port picked free can be
// taken before the node binds it, and under load a meta leader may not be
// elected in time: then the nodes are shut down and the whole start is
// retried (up to startAttempts times, while ctx lasts) on fresh ports, a
// fresh store and a fresh cluster name, and configure runs again from
// i = 0 (what it set up for the failed attempt is the caller's to undo).
func StartCluster(ctx context.Context, n int, dir string, configure func(i int, o *Options)) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("embedded: a cluster needs at least one node")
	}
	var err error
	for attempt := range startAttempts {
		var c *Cluster
		if c, err = startCluster(ctx, n, filepath.Join(dir, "attempt"+strconv.Itoa(attempt)), configure); err == nil {
			return c, nil
		}
		if ctx.Err() != nil || !(errors.Is(err, ErrNotReady) || errors.Is(err, ErrPortInUse)) {
			break
		}
	}
	return nil, err
}

// startAttempts bounds how often StartCluster tries; formTimeout bounds how
// long one attempt (and WaitJetStream) waits for JetStream to be ready. A
// fresh cluster elects a meta leader in about a second, or a few when the
// first votes split.
const (
	startAttempts = 4
	formTimeout   = 30 * time.Second
)

func startCluster(ctx context.Context, n int, dir string, configure func(i int, o *Options)) (*Cluster, error) {
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		var err error
		if clientPorts[i], err = FreePort("127.0.0.1"); err != nil {
			return nil, err
		}
		if routePorts[i], err = FreePort("127.0.0.1"); err != nil {
			return nil, err
		}
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(routePorts[i])
	}
	// A name of its own: a node of another cluster (of this process or of
	// another) that ends up on a port one of these nodes routes to is
	// refused, not merged into this cluster's meta group.
	name := fmt.Sprintf("embcache-%08x", rand.Uint32())
	c := &Cluster{Nodes: make([]*Server, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		node := "n" + strconv.Itoa(i+1)
		o := Options{
			StoreDir: filepath.Join(dir, node), Name: node, Port: clientPorts[i],
			ClusterName: name, ClusterPort: routePorts[i], Routes: routes,
		}
		if configure != nil {
			configure(i, &o)
		}
		wg.Go(func() { c.Nodes[i], errs[i] = Start(o) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Shutdown()
		return nil, err
	}
	if err := c.WaitJetStream(ctx); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// ClientURLs is every node's client URL, comma-separated, as nats.Connect takes it.
func (c *Cluster) ClientURLs() string {
	var s string
	for i, n := range c.Nodes {
		if i > 0 {
			s += ","
		}
		s += n.ClientURL()
	}
	return s
}

// Connect connects to the cluster (any node, failing over between them).
func (c *Cluster) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	return nats.Connect(c.ClientURLs(), append(base, opts...)...)
}

// Node returns the node with the given server name, or nil.
func (c *Cluster) Node(name string) *Server {
	for _, n := range c.Nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// WaitJetStream waits (formTimeout at most) until the running nodes'
// JetStream can place a stream with as many replicas as running nodes:
// exactly one meta leader, which sees every running node as a peer with
// JetStream and stats, and every running node's meta layer current,
// caught up with that leader and hearing from it (what nats-server's
// /healthz?js-meta-only=true checks). A stream's own group elects its
// leader after it is created: a create may still go unanswered for an
// election timeout (4 to 9 s) or more on a loaded machine. The
// ErrNotReady it returns names what was not ready when ctx or
// formTimeout ended.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, formTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		why := c.NotReady()
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ErrNotReady, why)
		case <-tick.C:
		}
	}
}

// NotReady says what keeps the running nodes' JetStream from placing a
// stream with as many replicas as running nodes (see WaitJetStream), or
// "" if nothing does: for a failure's message, and for a test that waits
// on it.
func (c *Cluster) NotReady() string {
	var running, leaders, peers []string
	for _, n := range c.Nodes {
		srv := n.NATS()
		if srv == nil {
			continue
		}
		running = append(running, n.Name())
		if srv.JetStreamIsLeader() { // a deposed leader may not know it yet
			leaders = append(leaders, n.Name())
			peers = srv.JetStreamClusterPeers()
		}
	}
	switch {
	case len(leaders) == 0:
		return fmt.Sprintf("no JetStream meta leader among the running nodes %v", running)
	case len(leaders) > 1:
		return fmt.Sprintf("nodes %v each think they lead the JetStream meta group", leaders)
	case len(peers) != len(running):
		slices.Sort(peers)
		return fmt.Sprintf("the JetStream meta leader %s sees %v of the running nodes %v as peers with JetStream and stats",
			leaders[0], peers, running)
	}
	for _, n := range c.Nodes {
		srv := n.NATS()
		if srv == nil {
			continue
		}
		if h := srv.Healthz(&server.HealthzOptions{JSMetaOnly: true}); h.Status != "ok" || h.Error != "" {
			return fmt.Sprintf("%s: %s (meta leader %s)", n.Name(), h.Error, leaders[0])
		}
	}
	return ""
}

// StreamLeader returns the node that leads the stream, as the cluster
// reports it.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Server, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || c.Node(info.Cluster.Leader) == nil {
		return nil, fmt.Errorf("embedded: stream %s has no known leader", stream)
	}
	return c.Node(info.Cluster.Leader), nil
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		if n != nil {
			wg.Go(n.Shutdown)
		}
	}
	wg.Wait()
}
