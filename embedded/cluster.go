package embedded

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is N embedded nodes routed to each other on loopback.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n nodes (n >= 1) with stores under dir/<name> and
// waits until JetStream has a meta leader, so streams can be created.
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
// long one attempt (and WaitJetStream) waits for the meta leader. A fresh
// cluster elects one in about a second, or a few when the first votes split.
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

// WaitJetStream waits (formTimeout at most) until the running nodes have
// exactly one JetStream meta leader and it sees every running node as a
// current peer, so a stream with as many replicas as running nodes can be
// placed.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, formTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		running := 0
		for _, n := range c.Nodes {
			if n.Running() {
				running++
			}
		}
		if c.leaderSeesAll(running) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: JetStream has no meta leader with all %d peers", ErrNotReady, running)
		case <-tick.C:
		}
	}
}

// leaderSeesAll reports whether exactly one node leads the meta group (a
// deposed leader may not know it yet) and that node sees running peers.
func (c *Cluster) leaderSeesAll(running int) bool {
	peers, leaders := 0, 0
	for _, n := range c.Nodes {
		if srv := n.NATS(); srv != nil && srv.JetStreamIsLeader() {
			leaders++
			peers = len(srv.JetStreamClusterPeers())
		}
	}
	return leaders == 1 && peers == running
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
