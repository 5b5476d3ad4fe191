package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Shards help only if their Raft leaders are on different servers: every
// write of a shard goes through its leader. JetStream elects each
// stream's leader on its own and does not rebalance them, and on a new
// cluster it often elects every shard's leader on the same server (the
// scale suite saw all three on one of three). SpreadLeaders moves them.

// Leaders names the server that leads each shard, in shard order ("" for
// a shard whose stream info cannot be read or that has no leader).
func (b *Bucket) Leaders(ctx context.Context) []string {
	out := make([]string, len(b.shards))
	for i, kv := range b.shards {
		if info, err := b.streamInfo(ctx, kv); err == nil && info.Cluster != nil {
			out[i] = info.Cluster.Leader
		}
	}
	return out
}

// infoTimeout bounds a shard's stream info request: a shard electing its
// leader answers nobody until it has one.
const infoTimeout = 2 * time.Second

func (b *Bucket) streamInfo(ctx context.Context, kv jetstream.KeyValue) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	s, err := b.js.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// SpreadLeaders asks each shard whose leader shares its server with an
// earlier shard's to move its leader to a server that leads the fewest
// shards so far among its replicas' servers (a leader step-down with a
// preferred server), and returns how many it asked. A single shard, or
// shards of one replica, have nothing to spread. The move takes the
// shard's writes through a leader election (a few hundred milliseconds);
// the protocol rides through it as through any leader change.
func (b *Bucket) SpreadLeaders(ctx context.Context) (int, error) {
	if len(b.shards) < 2 {
		return 0, nil
	}
	led := map[string]int{} // server -> shards it leads (after the moves asked for)
	moved := 0
	for _, kv := range b.shards {
		info, err := b.streamInfo(ctx, kv)
		if err != nil {
			return moved, err
		}
		c := info.Cluster
		if c == nil || c.Leader == "" || len(c.Replicas) == 0 {
			continue
		}
		servers := []string{c.Leader}
		for _, r := range c.Replicas {
			if r.Current && !r.Offline {
				servers = append(servers, r.Name)
			}
		}
		best := c.Leader
		for _, s := range servers {
			if led[s] < led[best] || (led[s] == led[best] && s < best) {
				best = s
			}
		}
		if led[best] < led[c.Leader] {
			if err := b.stepDown(ctx, kv.Bucket(), best); err != nil {
				return moved, err
			}
			moved++
		} else {
			best = c.Leader
		}
		led[best]++
	}
	return moved, nil
}

// stepDown asks bucket's stream leader to hand over to server.
func (b *Bucket) stepDown(ctx context.Context, bucket, server string) error {
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": server}})
	resp, err := b.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN.KV_"+bucket, req)
	if err != nil {
		return fmt.Errorf("lease: step-down of %s: %w", bucket, err)
	}
	var body struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil {
		return fmt.Errorf("lease: step-down of %s: %w", bucket, err)
	}
	if body.Error != nil {
		return fmt.Errorf("lease: step-down of %s to %s: %w", bucket, server, body.Error)
	}
	return nil
}
