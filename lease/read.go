package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
