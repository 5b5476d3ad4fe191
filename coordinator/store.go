package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/embcache/embcache/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the KV bucket of leases and committed records.
const DefaultBucket = "EMBCACHE_LEASES"

// leaseStore is the protocol's view of the KV bucket: create with a TTL,
// compare-and-set publishes that keep a per-key TTL, purge on a revision,
// and reads answered by the stream leader.
type leaseStore struct {
	nc        *nats.Conn
	js        jetstream.JetStream
	kv        jetstream.KeyValue
	bucket    string
	markerTTL time.Duration
	// direct reads with a direct get by subject, which per-tenant
	// permissions can allow; any replica may answer it, so it can lag (the
	// protocol stays correct: every decision is a revision-checked write).
	direct bool
}

func ensureBucket(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, bucket string, replicas int, markerTTL time.Duration) (*leaseStore, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         bucket,
			Description:    "embcache leases and committed records",
			History:        1,
			Storage:        jetstream.FileStorage,
			Replicas:       replicas,
			LimitMarkerTTL: markerTTL,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket) // created by another process meanwhile
		}
	}
	if err != nil {
		return nil, err
	}
	return &leaseStore{nc: nc, js: js, kv: kv, bucket: bucket, markerTTL: markerTTL}, nil
}

// create writes r under key if the key has no live value, with a per-key
// TTL. It returns the revision; ErrHeld means someone else has the key.
func (s *leaseStore) create(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	rev, err := s.kv.Create(ctx, key, r.encode(), jetstream.KeyTTL(wholeSeconds(ttl)))
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s", ErrHeld, key)
		}
		return 0, err
	}
	return rev, nil
}

// cas replaces the value at revision rev with r and a new per-key TTL.
// kv.Update would drop the TTL (nats.go #1994), so this publishes to the
// key's subject with the expected-sequence and TTL headers itself.
// ErrLeaseLost means rev is no longer the key's revision.
func (s *leaseStore) cas(ctx context.Context, key string, rev uint64, r Record, ttl time.Duration) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + s.bucket + "." + key, Data: r.encode()}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(wholeSeconds(ttl)))
	if err != nil {
		if isConflict(err) {
			return 0, fmt.Errorf("%w: %s is past revision %d", ErrLeaseLost, key, rev)
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// purge removes the key if it is still at rev, leaving a marker that
// expires after markerTTL. A key already past rev is ErrLeaseLost.
func (s *leaseStore) purge(ctx context.Context, key string, rev uint64) error {
	err := s.kv.Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(s.markerTTL))
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d", ErrLeaseLost, key, rev)
	}
	return err
}

// put writes r under key whatever is there, with a per-key TTL, and
// returns the revision.
func (s *leaseStore) put(ctx context.Context, key string, r Record, ttl time.Duration) (uint64, error) {
	msg := &nats.Msg{Subject: "$KV." + s.bucket + "." + key, Data: r.encode()}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(wholeSeconds(ttl)))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// purgeFor is purge with why in the purge's body, {"cause": "<cause>"}
// (docs/protocol.md 3): the reconciler announces the eviction with that
// cause, and a purge without one (a marker, a plain purge) as expired.
func (s *leaseStore) purgeFor(ctx context.Context, key string, rev uint64, cause events.Cause) error {
	msg := nats.NewMsg("$KV." + s.bucket + "." + key)
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	msg.Data = []byte(`{"cause":"` + cause.String() + `"}`)
	var opts []jetstream.PublishOpt
	if s.markerTTL > 0 {
		opts = append(opts, jetstream.WithMsgTTL(s.markerTTL))
	}
	_, err := s.js.PublishMsg(ctx, msg, opts...)
	if err != nil && isConflict(err) {
		return fmt.Errorf("%w: %s is past revision %d", ErrLeaseLost, key, rev)
	}
	return err
}

// purgeCause reads the cause a purge's body names; anything else (an
// expiry marker, a purge without a body) is expired.
func purgeCause(body []byte) events.Cause {
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

// current is what a read found: no live record (rev may still be a
// marker's), or a record at rev. A record that does not decode comes back
// with err wrapping ErrBadRecord and its revision.
type current struct {
	rev    uint64
	live   bool
	record Record
	stamp  time.Time     // when the server stored the message (zero if unknown)
	ttl    time.Duration // the message's own TTL (Nats-TTL); 0 if it has none
}

// read returns the key's current state from the stream leader. kv.Get may
// be answered by a follower that lags (a few percent of reads on R3), and
// the protocol decides on what is current.
func (s *leaseStore) read(ctx context.Context, key string) (current, error) {
	if s.direct {
		return s.readDirect(ctx, key)
	}
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + s.bucket + "." + key})
	resp, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+s.bucket, req)
	if err != nil {
		return current{}, err
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
		return current{}, fmt.Errorf("coordinator: bad MSG.GET response: %w", err)
	}
	if body.Error != nil {
		if body.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return current{}, nil
		}
		return current{}, body.Error
	}
	if body.Message == nil {
		return current{}, errors.New("coordinator: empty MSG.GET response")
	}
	c := current{rev: body.Message.Seq, stamp: body.Message.Time}
	if len(body.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(body.Message.Header)
		if err != nil {
			return c, fmt.Errorf("coordinator: bad headers on %s: %w", key, err)
		}
		if h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "" {
			return c, nil // deleted, purged or expired
		}
		c.ttl = parseTTL(h.Get(jetstream.MsgTTLHeader))
	}
	rec, err := DecodeRecord(body.Message.Data)
	if err != nil {
		return c, err
	}
	c.live, c.record = true, rec
	return c, nil
}

// readDirect reads the key's last message with
// $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>.
func (s *leaseStore) readDirect(ctx context.Context, key string) (current, error) {
	subject := "$KV." + s.bucket + "." + key
	resp, err := s.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+s.bucket+"."+subject, nil)
	if err != nil {
		return current{}, err
	}
	if status := resp.Header.Get("Status"); status != "" {
		if status == "404" {
			return current{}, nil
		}
		return current{}, fmt.Errorf("coordinator: direct get %s: status %s %s", key, status, resp.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(resp.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil {
		return current{}, fmt.Errorf("coordinator: direct get %s: bad sequence: %w", key, err)
	}
	c := current{rev: seq, ttl: parseTTL(resp.Header.Get(jetstream.MsgTTLHeader))}
	c.stamp, _ = time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	if resp.Header.Get("KV-Operation") != "" || resp.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return c, nil
	}
	rec, err := DecodeRecord(resp.Data)
	if err != nil {
		return c, err
	}
	c.live, c.record = true, rec
	return c, nil
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

// isRefusal reports whether err is the server's answer refusing a write
// (an API error): unlike a timeout, it says nothing was stored.
func isRefusal(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// isConflict reports whether err is the server refusing a revision-checked
// write: ErrKeyExists, ErrKeyRevisionMismatch, or the API codes 10071
// (R1) and 10164 (R3) that mean the same.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
