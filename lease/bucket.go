package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the KV bucket of leases and committed records.
const DefaultBucket = "EMBCACHE_LEASES"

// BucketConfig says which bucket to open and how to create it if it is
// absent. Name is required.
type BucketConfig struct {
	Name     string
	Replicas int // when created (0: 1)
	// MarkerTTL is how long a purge's marker stays (and the bucket's
	// LimitMarkerTTL when created); 0 keeps markers until compaction.
	MarkerTTL time.Duration
	// Direct reads with a direct get by subject, which per-tenant
	// permissions can allow; any replica may answer it, so it can lag.
	// The protocol stays correct (every decision is a revision-checked
	// write), but a tombstone read this way can be missed for a moment
	// (docs/protocol.md 4.4).
	Direct bool
	// Shards is how many KV buckets the keys are spread over when the
	// bucket is created (0: 1): each is a stream of its own, with its own
	// Raft leader. The number is recorded in the first bucket's metadata
	// and every process reads it from there; opening a bucket created with
	// another number than a non-zero Shards is ErrShards.
	Shards int
}

// MaxShards bounds BucketConfig.Shards.
const MaxShards = 64

// shardsMetadata is the first bucket's metadata key that records how many
// shards there are.
const shardsMetadata = "embcache_lease_shards"

// Bucket is the protocol's view of the KV bucket: create with a TTL,
// compare-and-set publishes that keep a per-key TTL, purges on a
// revision, and reads answered by the stream leader. Its keys may be
// spread over several KV buckets (shards, ShardOf); every call that takes
// a key goes to the key's shard. Safe for concurrent use.
type Bucket struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	cfg    BucketConfig
	shards []jetstream.KeyValue // shard i is bucket ShardName(cfg.Name, i)
	tombs  sharedReads[Tomb]    // tombstone reads in flight
}

// ShardName is the KV bucket of shard i of the bucket name: name itself
// for shard 0, name_<i> for the others.
func ShardName(name string, i int) string {
	if i == 0 {
		return name
	}
	return name + "_" + strconv.Itoa(i)
}

// ValueKey is the bucket key of a tenant's value: <tenant>.<64 hex>.
func ValueKey(tenant string, key cachekey.Key) string { return tenant + "." + key.String() }

// ShardOf is the shard of a bucket key among k shards: for a value's key,
// <tenant>.<64 hex>, the key's first byte modulo k (keys are BLAKE3
// digests, so shards fill evenly); every other key (the reconcilers'
// election) is in shard 0. Tombstones are the exception: one in every
// shard (PutTombstone, Tombstone), so Read, Put and Purge of a tombstone's
// key reach shard 0's alone.
func ShardOf(key string, k int) int {
	if k <= 1 {
		return 0
	}
	_, hexKey, ok := strings.Cut(key, ".")
	if !ok || len(hexKey) != 64 {
		return 0
	}
	v, err := strconv.ParseUint(hexKey[:2], 16, 8)
	if err != nil {
		return 0
	}
	return int(v) % k
}

// OpenBucket binds the bucket cfg names, creating it (and its shards) if
// it is absent.
func OpenBucket(ctx context.Context, nc *nats.Conn, cfg BucketConfig) (*Bucket, error) {
	return openBucket(ctx, nc, cfg, true)
}

// BindBucket binds the bucket cfg names and its shards; it is an error if
// one is absent.
func BindBucket(ctx context.Context, nc *nats.Conn, cfg BucketConfig) (*Bucket, error) {
	return openBucket(ctx, nc, cfg, false)
}

func openBucket(ctx context.Context, nc *nats.Conn, cfg BucketConfig, create bool) (*Bucket, error) {
	if cfg.Name == "" {
		return nil, errors.New("lease: no bucket name")
	}
	if cfg.Shards < 0 || cfg.Shards > MaxShards {
		return nil, fmt.Errorf("%w: %d shards, want 1..%d", ErrShards, cfg.Shards, MaxShards)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	first, err := bindOrCreate(ctx, js, cfg, 0, create)
	if err != nil {
		return nil, err
	}
	st, err := first.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Name, err)
	}
	k := 1
	if v, ok := st.Metadata()[shardsMetadata]; ok {
		if k, err = strconv.Atoi(v); err != nil || k < 1 || k > MaxShards {
			return nil, fmt.Errorf("%w: bucket %s records %q shards", ErrShards, cfg.Name, v)
		}
	}
	if cfg.Shards != 0 && cfg.Shards != k {
		return nil, fmt.Errorf("%w: bucket %s was created with %d shards, not %d", ErrShards, cfg.Name, k, cfg.Shards)
	}
	cfg.Shards = k
	b := &Bucket{nc: nc, js: js, cfg: cfg, shards: []jetstream.KeyValue{first}}
	for i := 1; i < k; i++ {
		kv, err := bindOrCreate(ctx, js, cfg, i, create)
		if err != nil {
			return nil, err
		}
		b.shards = append(b.shards, kv)
	}
	return b, nil
}

// bindOrCreate binds shard i of cfg's bucket, creating it if asked and
// absent (the first with the number of shards in its metadata, each
// republishing what it stores: Changes).
func bindOrCreate(ctx context.Context, js jetstream.JetStream, cfg BucketConfig, i int, create bool) (jetstream.KeyValue, error) {
	name := ShardName(cfg.Name, i)
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) && create {
		kcfg := jetstream.KeyValueConfig{
			Bucket:         name,
			Description:    "embcache leases and committed records",
			History:        1,
			Storage:        jetstream.FileStorage,
			Replicas:       max(1, cfg.Replicas),
			LimitMarkerTTL: cfg.MarkerTTL,
			RePublish:      republish(name),
		}
		if i == 0 && cfg.Shards > 1 {
			kcfg.Metadata = map[string]string{shardsMetadata: strconv.Itoa(cfg.Shards)}
		}
		kv, err = js.CreateKeyValue(ctx, kcfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, name) // created by another process meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", name, err)
	}
	return kv, nil
}

// KV is the jetstream handle of the shard that holds key, for reading it
// as it is stored.
func (b *Bucket) KV(key string) jetstream.KeyValue { return b.shards[ShardOf(key, len(b.shards))] }

// Shards are the jetstream handles of every shard, in shard order, for
// watching and listing keys.
func (b *Bucket) Shards() []jetstream.KeyValue { return slices.Clone(b.shards) }

// Close stops the Bucket's own work: the tombstone reads it sends on its
// own goroutines for callers that joined one (Tombstone) are cancelled,
// and Close returns once they have ended; their callers get an error
// wrapping ErrClosed, as does a later caller that would join one. Every
// other call works as before, and reads already in flight on callers' own
// goroutines finish as they would: the connection is the caller's, and
// stays open. Close is idempotent and safe for concurrent use.
func (b *Bucket) Close() { b.tombs.close() }

// Name is the bucket's name (its first shard's).
func (b *Bucket) Name() string { return b.cfg.Name }

// Direct reports whether reads may be answered by any replica
// (BucketConfig.Direct).
func (b *Bucket) Direct() bool { return b.cfg.Direct }

// shardOf is the shard that holds key.
func (b *Bucket) shardOf(key string) int { return ShardOf(key, len(b.shards)) }

// Subject is the subject of key's messages, in its shard: $KV.<bucket>.<key>.
func (b *Bucket) Subject(key string) string { return b.subjectIn(b.shardOf(key), key) }

// subjectIn is the subject of key's messages in shard.
func (b *Bucket) subjectIn(shard int, key string) string {
	return "$KV." + ShardName(b.cfg.Name, shard) + "." + key
}

// KeyOfSubject is the bucket key a message on a shard's subject is about:
// $KV.<bucket>.<key>.
func KeyOfSubject(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, "$KV.")
	if !ok {
		return "", false
	}
	_, key, ok := strings.Cut(rest, ".")
	return key, ok
}
