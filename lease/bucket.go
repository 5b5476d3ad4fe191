package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/events"
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

// Create writes r under key if the key has no live value, with a per-key
// TTL. It returns the revision; ErrHeld means someone else has the key.
func (b *Bucket) Create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	var rev uint64
	err = whileInFlight(ctx, key, func() (err error) {
		rev, err = b.KV(key).Create(ctx, key, data, jetstream.KeyTTL(wholeSeconds(ttl)))
		return err
	})
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s", ErrHeld, key)
		}
		return 0, err
	}
	return rev, nil
}

// CompareAndSet replaces the value at revision rev with r and a new per-key TTL.
// kv.Update would drop the TTL (nats.go #1994), so this publishes to the
// key's subject with the expected-sequence and TTL headers itself.
// ErrLost means rev is no longer the key's revision.
func (b *Bucket) CompareAndSet(ctx context.Context, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	return b.compareAndSetIn(ctx, b.shardOf(key), key, rev, r, ttl)
}

// compareAndSetIn is CompareAndSet in shard. rev 0 means the key has no
// message in it.
func (b *Bucket) compareAndSetIn(ctx context.Context, shard int, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: b.subjectIn(shard, key), Data: data}
	var ack *jetstream.PubAck
	err = whileInFlight(ctx, key, func() (err error) {
		ack, err = b.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(wholeSeconds(ttl)))
		return err
	})
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// Purge removes the key if it is still at rev, leaving a marker that
// expires after markerTTL. A key already past rev is ErrLost.
func (b *Bucket) Purge(ctx context.Context, key string, rev uint64) error {
	err := whileInFlight(ctx, key, func() error {
		return b.KV(key).Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(b.cfg.MarkerTTL))
	})
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
	}
	return err
}

// Put writes r under key whatever is there, with a per-key TTL, and
// returns the revision.
func (b *Bucket) Put(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	return b.putIn(ctx, b.shardOf(key), key, r, ttl)
}

// putIn is Put into shard.
func (b *Bucket) putIn(ctx context.Context, shard int, key string, r Record, ttl time.Duration) (uint64, error) {
	data, err := r.encode()
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: b.subjectIn(shard, key), Data: data}
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(wholeSeconds(ttl)))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// PurgeFor is Purge with why in the purge's body, {"cause": "<cause>"}
// (docs/protocol.md 3): the reconciler announces the eviction with that
// cause, and a purge without one (a marker, a plain purge) as expired.
func (b *Bucket) PurgeFor(ctx context.Context, key string, rev uint64, cause events.Cause) error {
	msg := nats.NewMsg(b.Subject(key))
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	msg.Data = []byte(`{"cause":"` + cause.String() + `"}`)
	var opts []jetstream.PublishOpt
	if b.cfg.MarkerTTL > 0 {
		opts = append(opts, jetstream.WithMsgTTL(b.cfg.MarkerTTL))
	}
	err := whileInFlight(ctx, key, func() error {
		_, err := b.js.PublishMsg(ctx, msg, opts...)
		return err
	})
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d (%v)", ErrLost, key, rev, err)
	}
	return err
}

// PurgeCause reads the cause a purge's body names; anything else (an
// expiry marker, a purge without a body) is expired.
func PurgeCause(body []byte) events.Cause {
	var b struct {
		Cause string `json:"cause"`
	}
	if json.Unmarshal(body, &b) == nil {
		for _, c := range []events.Cause{events.CauseInvalidated, events.CauseCorrupt, events.CauseExplicit} {
			if b.Cause == c.String() {
				return c
			}
		}
	}
	return events.CauseExpired
}

// Entry is what a read found: no live record (Rev may still be a
// marker's), or a Record at Rev. A record that does not decode under its
// key (DecodeRecord) comes back with an error wrapping ErrBadRecord, and
// its revision, time stamp and TTL.
type Entry struct {
	Rev    uint64
	Live   bool
	Record Record
	Stamp  time.Time     // when the server stored the message (zero if unknown)
	TTL    time.Duration // the message's own TTL (Nats-TTL); 0 if it has none
}

// Outlived reports whether e's message, by the server's time stamp, is
// older at now than both leaseTTL and its own TTL: a record that does not
// decode is purged then (docs/protocol.md 3, rule 6). A younger one may be
// a newer version's record in a rolling upgrade, and its own TTL is the
// writer's word on how long it lives.
func (e Entry) Outlived(now time.Time, leaseTTL time.Duration) bool {
	return e.Rev != 0 && !e.Stamp.IsZero() && now.Sub(e.Stamp) > max(leaseTTL, e.TTL)
}

// Read returns the key's current state from the stream leader. kv.Get may
// be answered by a follower that lags (a few percent of reads on R3), and
// the protocol decides on what is current.
func (b *Bucket) Read(ctx context.Context, key string) (Entry, error) {
	return b.readIn(ctx, b.shardOf(key), key)
}

// readIn is Read from shard.
func (b *Bucket) readIn(ctx context.Context, shard int, key string) (Entry, error) {
	if b.cfg.Direct {
		return b.readDirect(ctx, shard, key)
	}
	req, _ := json.Marshal(map[string]string{"last_by_subj": b.subjectIn(shard, key)})
	resp, err := b.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+ShardName(b.cfg.Name, shard), req)
	if err != nil {
		return Entry{}, err
	}
	var body struct {
		Message *struct {
			Seq    uint64    `json:"seq"`
			Header []byte    `json:"hdrs"`
			Data   []byte    `json:"data"`
			Time   time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil {
		return Entry{}, fmt.Errorf("lease: bad MSG.GET response: %w", err)
	}
	if body.Error != nil {
		if body.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return Entry{}, nil
		}
		return Entry{}, body.Error
	}
	if body.Message == nil {
		return Entry{}, errors.New("lease: empty MSG.GET response")
	}
	c := Entry{Rev: body.Message.Seq, Stamp: body.Message.Time}
	if len(body.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(body.Message.Header)
		if err != nil {
			return c, fmt.Errorf("lease: bad headers on %s: %w", key, err)
		}
		if h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "" {
			return c, nil // deleted, purged or expired
		}
		c.TTL = parseTTL(h.Get(jetstream.MsgTTLHeader))
	}
	rec, err := DecodeRecord(key, body.Message.Data)
	if err != nil {
		return c, err
	}
	c.Live, c.Record = true, rec
	return c, nil
}

// readDirect reads the key's last message with
// $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>.
func (b *Bucket) readDirect(ctx context.Context, shard int, key string) (Entry, error) {
	subject := b.subjectIn(shard, key)
	resp, err := b.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+ShardName(b.cfg.Name, shard)+"."+subject, nil)
	if err != nil {
		return Entry{}, err
	}
	if status := resp.Header.Get("Status"); status != "" {
		if status == "404" {
			return Entry{}, nil
		}
		return Entry{}, fmt.Errorf("lease: direct get %s: status %s %s", key, status, resp.Header.Get("Description"))
	}
	return entryOf(resp, key, "direct get "+key)
}

// entryOf is the Entry a message with the stream's headers carries (a
// direct get's answer, a republished message): Nats-Sequence,
// Nats-Time-Stamp, Nats-TTL, and a KV operation or marker if the key was
// deleted, purged or expired. key is the message's key; what names the
// message in errors.
func entryOf(m *nats.Msg, key, what string) (Entry, error) {
	seq, err := strconv.ParseUint(serverHeader(m, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return Entry{}, fmt.Errorf("lease: %s: bad sequence: %w", what, err)
	}
	c := Entry{Rev: seq, TTL: parseTTL(m.Header.Get(jetstream.MsgTTLHeader))}
	c.Stamp, _ = time.Parse(time.RFC3339Nano, serverHeader(m, jetstream.TimeStampHeaer))
	if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return c, nil
	}
	rec, err := DecodeRecord(key, m.Data)
	if err != nil {
		return c, err
	}
	c.Live, c.Record = true, rec
	return c, nil
}

// serverHeader is the value the server gave header name: the last one.
// The server appends its own (Nats-Sequence, Nats-Time-Stamp) after the
// headers the writer stored, so a writer that set one itself cannot pass
// it off as the server's.
func serverHeader(m *nats.Msg, name string) string {
	v := m.Header.Values(name)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// wholeSeconds rounds a TTL up to whole seconds. The server keeps
// per-message TTLs in whole seconds, truncating a fraction (1.9s expires
// after 1s) and refusing less than 1s; rounded up, a message never expires
// before the deadline the writer computed from ttl
// (docs/jetstream-notes.md).
func wholeSeconds(ttl time.Duration) time.Duration {
	return max(time.Second, (ttl + time.Second - 1).Truncate(time.Second))
}

// parseTTL reads a Nats-TTL header: a Go duration ("5s") as nats.go
// writes it, or whole seconds. "never", absent or unreadable: 0.
func parseTTL(v string) time.Duration {
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// IsRefusal reports whether err is the server's answer refusing a write
// (an API error): unlike a timeout, it says nothing was stored.
func IsRefusal(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// isConflict reports whether err is the server refusing a revision-checked
// write because the key is past the revision: ErrKeyExists,
// ErrKeyRevisionMismatch, or API code 10071. A refusal for another write
// in flight (isInFlight) is not one, and whileInFlight sends it again.
func isConflict(err error) bool {
	if isInFlight(err) {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// isInFlight reports whether err is a replicated stream's leader refusing
// a revision-checked write because another write on the same subject is
// proposed and not yet applied (API code 10164; nats-server checks this
// before the revision). Nothing was stored and nothing is said about the
// key: the leader answers a write before it forgets that write's entry,
// so a holder's next write, sent on the answer, can meet its own last one
// (docs/jetstream-notes.md (c)). nats.go's kv.Create wraps it in
// ErrKeyExists.
func isInFlight(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// whileInFlight runs write, and again after a short backoff for as long as
// it is refused for another write in flight on key (isInFlight): that
// write is applied, or dropped by a leader change, within a Raft round,
// and then the revision check answers. At ctx's end the last refusal is
// returned: nothing was stored.
func whileInFlight(ctx context.Context, key string, write func() error) error {
	delay := time.Millisecond
	for {
		err := write()
		if !isInFlight(err) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lease: %s: another write on it stayed in flight: %w", key, err)
		case <-t.C:
		}
		delay = min(2*delay, 64*time.Millisecond)
	}
}
