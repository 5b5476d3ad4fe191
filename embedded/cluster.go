package embedded

import (
	"context"
	"errors"
	"fmt"
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
// configure, if set, edits each node's options before it starts. A port
// picked free can be taken by another process before the node binds it;
// then the whole start is retried on fresh ports (configure runs again).
func StartCluster(ctx context.Context, n int, dir string, configure func(i int, o *Options)) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("embedded: a cluster needs at least one node")
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *Cluster
		if c, err = startCluster(ctx, n, filepath.Join(dir, "attempt"+strconv.Itoa(attempt)), configure); err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

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
	c := &Cluster{Nodes: make([]*Server, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		name := "n" + strconv.Itoa(i+1)
		o := Options{
			StoreDir: filepath.Join(dir, name), Name: name, Port: clientPorts[i],
			ClusterName: "embcache", ClusterPort: routePorts[i], Routes: routes,
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

// WaitJetStream waits until the running nodes have a JetStream meta
// leader that sees every running node as a current peer, so a stream with
// as many replicas as running nodes can be placed.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
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
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *Cluster) leaderSeesAll(running int) bool {
	for _, n := range c.Nodes {
		if srv := n.NATS(); srv != nil && srv.JetStreamIsLeader() {
			return len(srv.JetStreamClusterPeers()) == running
		}
	}
	return false
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
