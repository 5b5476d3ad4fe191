package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The nats-server behaviours the lease protocol depends on, measured on
// real embedded servers so that an upgrade that changes one is noticed.
// docs/jetstream-notes.md describes each and names its test here.

var jsnTrials = flag.Int("jsnotes.trials", 0,
	"CAS trials per subtest of TestJetStreamTTLMarkerWipesLateCAS (0: EMBCACHE_JSNOTES_TRIALS or 400)")

const (
	jsnTTL     = time.Second // the per-key TTL of the create
	jsnCASTTL  = time.Hour   // the CAS's own TTL: long, so only a marker can remove it during the test
	jsnBatch   = 200         // keys created together; a batch starts every jsnGap
	jsnGap     = 700 * time.Millisecond
	jsnFrom    = -60 * time.Millisecond // CAS send offsets around createSend + TTL
	jsnTo      = 340 * time.Millisecond
	jsnTimeout = 5 * time.Second // per request
)

// jsnTrial is one key: created with a TTL, then one CAS on its revision
// sent at createSend + TTL + offset.
type jsnTrial struct {
	key        string
	batch      int
	createSend time.Time // monotonic
	rev        uint64
	createTS   time.Time // the server's timestamp of rev
	offset     time.Duration
	casSend    time.Time
	casAck     time.Time // when the reply (ack or refusal) arrived
	casRev     uint64
	createErr  error
	casErr     error
	final      jsnMsg // the key's last message once rev is gone
}

func (tr *jsnTrial) deadline() time.Time { return tr.createSend.Add(jsnTTL) }

// jsnMsg is a message read from the stream leader.
type jsnMsg struct {
	found  bool
	seq    uint64
	marker string // Nats-Marker-Reason
	time   time.Time
}

// jsnGet reads one message of stream KV_<bucket> from the stream leader
// ($JS.API.STREAM.MSG.GET; a direct get may be answered by a follower).
func jsnGet(ctx context.Context, nc *nats.Conn, bucket string, req map[string]any) (jsnMsg, error) {
	ctx, cancel := context.WithTimeout(ctx, jsnTimeout)
	defer cancel()
	b, _ := json.Marshal(req)
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, b)
	if err != nil {
		return jsnMsg{}, err
	}
	var body struct {
		Message *struct {
			Seq    uint64    `json:"seq"`
			Header []byte    `json:"hdrs"`
			Time   time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil {
		return jsnMsg{}, err
	}
	if body.Error != nil {
		if body.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return jsnMsg{}, nil
		}
		return jsnMsg{}, body.Error
	}
	if body.Message == nil {
		return jsnMsg{}, errors.New("empty MSG.GET response")
	}
	m := jsnMsg{found: true, seq: body.Message.Seq, time: body.Message.Time}
	if len(body.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(body.Message.Header)
		if err != nil {
			return m, err
		}
		m.marker = h.Get(jetstream.MarkerReasonHeader)
	}
	return m, nil
}

// jsnWritable waits until kv takes writes: a new R3 stream answers "no
// response from stream" until its leader is elected.
func jsnWritable(t *testing.T, ctx context.Context, kv jetstream.KeyValue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := kv.Put(pctx, "ready", nil)
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("bucket %s takes no writes: %v", kv.Bucket(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// jsnIsConflict: the CAS was refused before it was proposed, by the
// revision check (10071) or for another write in flight (10164, which the
// lease package resends): either way nothing was stored.
func jsnIsConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// jsnTally is what one measurement found.
type jsnTally struct {
	trials, refused, unknown int
	early, earlyWiped        int             // accepted, acked before createSend + TTL
	late, lateWiped          int             // accepted, acked at or after it
	wipedAck                 []time.Duration // wiped: ack - (createSend + TTL)
	wipedOffset              []time.Duration // wiped: planned send offset
	markerLate               []time.Duration // expiry markers: marker time - (create time + TTL)
	wipedPerBatch            []int
	gone                     int // refused CAS whose key has no message left (no marker)
	watchedPurges            int // purge/marker entries a watcher of the bucket saw
}

func (s jsnTally) String() string {
	return fmt.Sprintf("trials %d: refused %d, unknown %d; accepted and acked before create+TTL %d (wiped %d); "+
		"acked at or after it %d (wiped %d); wiped acks at create+TTL %s; wiped send offsets %s; "+
		"wiped per batch %v; expiry markers late by %s; expired keys gone without a marker %d; purges a watcher saw %d",
		s.trials, s.refused, s.unknown, s.early, s.earlyWiped, s.late, s.lateWiped,
		jsnSpread(s.wipedAck), jsnSpread(s.wipedOffset), s.wipedPerBatch, jsnSpread(s.markerLate), s.gone, s.watchedPurges)
}

// jsnSpread is "min/median/max" of ds, rounded to the millisecond.
func jsnSpread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) string {
		if d = d.Round(time.Millisecond); d >= 0 {
			return "+" + d.String()
		}
		return d.String()
	}
	return r(s[0]) + "/" + r(s[len(s)/2]) + "/" + r(s[len(s)-1])
}

// jsnMeasure runs trials keys through kv in batches: create with a TTL,
// one CAS (a publish with the expected last subject sequence and a
// Nats-TTL, as the lease protocol does) at a staggered offset around
// createSend + TTL, then, once the server has removed the created
// revision, reads each key's last message from the stream leader to see
// whether an accepted CAS survived. markers says whether the stream
// places subject delete markers.
func jsnMeasure(t *testing.T, ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, markers bool, trials int) jsnTally {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bucket := kv.Bucket()
	jsnWritable(t, ctx, kv)
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		t.Fatal(err)
	}
	var purgesMu sync.Mutex
	purges := 0
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range w.Updates() {
			if e != nil && e.Operation() == jetstream.KeyValuePurge {
				purgesMu.Lock()
				purges++
				purgesMu.Unlock()
			}
		}
	}()
	defer func() { w.Stop(); <-watched }()

	all := make([]*jsnTrial, trials)
	var wg sync.WaitGroup
	start := time.Now()
	for b := 0; b*jsnBatch < trials; b++ {
		n := min(jsnBatch, trials-b*jsnBatch)
		perm := rand.Perm(n)
		for i := range n {
			tr := &jsnTrial{
				key:    fmt.Sprintf("b%03d.k%03d", b, i),
				batch:  b,
				offset: jsnFrom + time.Duration(perm[i])*(jsnTo-jsnFrom)/time.Duration(n),
			}
			all[b*jsnBatch+i] = tr
			wg.Go(func() {
				time.Sleep(time.Until(start.Add(time.Duration(b) * jsnGap)))
				jsnRun(ctx, nc, js, kv, tr)
			})
		}
	}
	wg.Wait()

	// Every created revision is removed by the server's TTL sweep (a
	// marker, or a plain removal when the CAS landed first); only then is
	// a surviving CAS known to survive.
	s := jsnTally{wipedPerBatch: make([]int, (trials+jsnBatch-1)/jsnBatch)}
	verify := time.Now().Add(30 * time.Second)
	for _, tr := range all {
		if tr.rev == 0 {
			t.Fatalf("%s: create failed: %v", tr.key, tr.createErr)
		}
		for {
			m, err := jsnGet(ctx, nc, bucket, map[string]any{"seq": tr.rev})
			if err == nil && !m.found {
				break
			}
			if time.Now().After(verify) {
				t.Fatalf("%s: revision %d not removed %v after its TTL (err %v)", tr.key, tr.rev, time.Since(tr.deadline()), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		tr.final, err = jsnGet(ctx, nc, bucket, map[string]any{"last_by_subj": "$KV." + bucket + "." + tr.key})
		if err != nil {
			t.Fatalf("%s: %v", tr.key, err)
		}
		s.add(t, tr, markers)
	}
	if markers {
		// The watcher should see each marker (it may lag a little).
		for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
			purgesMu.Lock()
			n := purges
			purgesMu.Unlock()
			if n >= s.refused+s.earlyWiped+s.lateWiped {
				break
			}
		}
	} else {
		time.Sleep(200 * time.Millisecond)
	}
	purgesMu.Lock()
	s.watchedPurges = purges
	purgesMu.Unlock()
	return s
}

// jsnRun creates tr's key, then sends its CAS at createSend + TTL + offset.
func jsnRun(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, kv jetstream.KeyValue, tr *jsnTrial) {
	cctx, cancel := context.WithTimeout(ctx, jsnTimeout)
	defer cancel()
	tr.createSend = time.Now()
	rev, err := kv.Create(cctx, tr.key, []byte("created"), jetstream.KeyTTL(jsnTTL))
	if err != nil {
		tr.createErr = err
		return
	}
	tr.rev = rev
	if m, err := jsnGet(ctx, nc, kv.Bucket(), map[string]any{"seq": rev}); err == nil && m.found {
		tr.createTS = m.time
	}
	time.Sleep(time.Until(tr.deadline().Add(tr.offset)))
	pctx, cancel := context.WithTimeout(ctx, jsnTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + tr.key, Data: []byte("cas")}
	tr.casSend = time.Now()
	ack, err := js.PublishMsg(pctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(jsnCASTTL))
	tr.casAck = time.Now()
	if err != nil {
		tr.casErr = err
		return
	}
	tr.casRev = ack.Sequence
}

// add classifies one trial. It fails the test on what the server must
// never do: expire a key before its TTL, or wipe a CAS acknowledged
// before createSend + TTL.
func (s *jsnTally) add(t *testing.T, tr *jsnTrial, markers bool) {
	t.Helper()
	s.trials++
	f := tr.final
	if f.marker != "" && !tr.createTS.IsZero() {
		late := f.time.Sub(tr.createTS.Add(jsnTTL))
		if late < 0 {
			t.Errorf("%s: expiry marker at %v, %v before create time + TTL", tr.key, f.time, -late)
		}
		s.markerLate = append(s.markerLate, late)
	}
	early := tr.casAck.Before(tr.deadline())
	switch {
	case tr.casErr != nil && jsnIsConflict(tr.casErr):
		s.refused++
		if early {
			t.Errorf("%s: CAS refused at create+TTL%v: the key expired early (%v)", tr.key, tr.casAck.Sub(tr.deadline()), tr.casErr)
		}
		switch {
		case !f.found:
			s.gone++
			if markers {
				t.Errorf("%s: expired without a marker on a stream with markers", tr.key)
			}
		case f.marker == "":
			t.Errorf("%s: CAS refused but the key holds a live message %d", tr.key, f.seq)
		}
	case tr.casErr != nil:
		s.unknown++ // a timeout: the outcome is not known
	default:
		wiped := false
		switch {
		case f.found && f.seq == tr.casRev && f.marker == "":
		case f.found && f.seq > tr.casRev && f.marker != "":
			wiped = true
		default:
			t.Errorf("%s: accepted CAS %d, then the key's last message is %+v", tr.key, tr.casRev, f)
		}
		if early {
			s.early++
			if wiped {
				s.earlyWiped++
				t.Errorf("%s: CAS acknowledged at create+TTL%v (before the TTL) was wiped by marker %d (%s)",
					tr.key, tr.casAck.Sub(tr.deadline()), f.seq, f.marker)
			}
		} else {
			s.late++
			if wiped {
				s.lateWiped++
			}
		}
		if wiped {
			s.wipedPerBatch[tr.batch]++
			s.wipedAck = append(s.wipedAck, tr.casAck.Sub(tr.deadline()))
			s.wipedOffset = append(s.wipedOffset, tr.offset)
		}
	}
}

func jsnTrialCount() int {
	n := *jsnTrials
	if n == 0 {
		n, _ = strconv.Atoi(os.Getenv("EMBCACHE_JSNOTES_TRIALS"))
	}
	if n <= 0 {
		n = 400
	}
	return n
}

// TestJetStreamTTLMarkerWipesLateCAS: a key created with a per-key TTL
// and then updated by a CAS on its revision around the time the TTL
// lapses. On a stream that places subject delete markers, a CAS the
// server accepted after the TTL lapsed can be purged by the marker the
// TTL sweep places afterwards (a Nats-Rollup: sub message with no
// expected-sequence condition): often on R3, rarely on R1, never without
// markers. The lease protocol's rule rests on what this asserts: a CAS
// acknowledged before createSend + TTL is never wiped. That late CAS are
// wiped at all is logged; EMBCACHE_EXPECT_TTL_WIPE=1 makes none on R3 an
// error (it depends on load: see docs/jetstream-notes.md).
func TestJetStreamTTLMarkerWipesLateCAS(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement on a 3-node cluster")
	}
	trials := jsnTrialCount()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(trials)*20*time.Millisecond)
	defer cancel()

	cl, nc, js := threeNodeJS(t, ctx)

	var summary []string
	report := func(name string, s jsnTally) {
		t.Logf("%s: %s", name, s)
		summary = append(summary, fmt.Sprintf("%s %d/%d late CAS wiped (%d acked before create+TTL, %d wiped)",
			name, s.lateWiped, s.late, s.early, s.earlyWiped))
	}

	t.Run("R3Markers", func(t *testing.T) {
		began := time.Now()
		kv, err := createKV(ctx, cl, js, jetstream.KeyValueConfig{Bucket: "JSN_R3_MARKERS", History: 1,
			Storage: jetstream.FileStorage, Replicas: 3, LimitMarkerTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("bucket ready in %v", time.Since(began).Round(time.Millisecond))
		s := jsnMeasure(t, ctx, nc, kv, true, trials)
		report("R3 markers", s)
		if s.lateWiped == 0 {
			msg := "nats-server no longer wipes late CAS with its TTL marker: revisit docs/jetstream-notes.md"
			if os.Getenv("EMBCACHE_EXPECT_TTL_WIPE") == "1" {
				t.Error(msg)
			} else {
				t.Log(msg + " (or this run missed it; EMBCACHE_EXPECT_TTL_WIPE=1 makes it an error)")
			}
		}
	})

	t.Run("R3NoMarkers", func(t *testing.T) {
		const bucket = "JSN_R3_NOMARKERS"
		if err := createR3(ctx, cl, js, "KV_"+bucket, func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, noMarkerKVStream(bucket, 3))
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return nil // an earlier try's create, answered too late
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		s := jsnMeasure(t, ctx, nc, kv, false, trials)
		report("R3 no markers", s)
		if s.lateWiped != 0 {
			t.Errorf("%d CAS wiped on a stream without subject delete markers", s.lateWiped)
		}
		// An expired key simply disappears: no marker, nothing for a watcher.
		if s.watchedPurges != 0 {
			t.Errorf("a watcher saw %d purges on a stream without markers", s.watchedPurges)
		}
		if s.gone != s.refused {
			t.Errorf("%d of %d expired keys left a message on a stream without markers", s.refused-s.gone, s.refused)
		}
	})

	t.Run("R1Markers", func(t *testing.T) {
		nc, _, kv := singleNodeKV(t, ctx, "JSN_R1_MARKERS")
		// R1 wipes late CAS too, more rarely (the sweep decides a message
		// is its subject's last, then places the marker: a CAS can land in
		// between), so only the premise is asserted.
		report("R1 markers", jsnMeasure(t, ctx, nc, kv, true, trials))
	})

	line := "jetstream TTL marker: " + strings.Join(summary, "; ")
	t.Log(line)
	fmt.Println(line)
}

// jsnHeader returns header h of message seq of stream KV_<bucket>, read
// from the stream leader.
func jsnHeader(t *testing.T, ctx context.Context, nc *nats.Conn, bucket string, seq uint64, h string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"seq": seq})
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, b)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Message *struct {
			Header []byte `json:"hdrs"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &body); err != nil || body.Error != nil || body.Message == nil {
		t.Fatalf("get %d: %v %v", seq, err, body.Error)
	}
	if len(body.Message.Header) == 0 {
		return ""
	}
	hdr, err := nats.DecodeHeadersMsg(body.Message.Header)
	if err != nil {
		t.Fatal(err)
	}
	return hdr.Get(h)
}

// TestJetStreamKVUpdateDropsKeyTTL: kv.Update publishes without Nats-TTL
// (it takes no TTL option: nats.go #1994), so a key created with a
// per-key TTL and then updated no longer expires. The lease protocol
// publishes its CAS itself, with the expected last subject sequence and
// Nats-TTL, which keeps the TTL.
func TestJetStreamKVUpdateDropsKeyTTL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const bucket = "JSN_UPDATE"
	nc, js, kv := singleNodeKV(t, ctx, bucket)
	rev, err := kv.Create(ctx, "k", []byte("v1"), jetstream.KeyTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got := jsnHeader(t, ctx, nc, bucket, rev, jetstream.MsgTTLHeader); got != "1h0m0s" {
		t.Fatalf("create: Nats-TTL %q, want 1h0m0s", got)
	}
	rev, err = kv.Update(ctx, "k", []byte("v2"), rev)
	if err != nil {
		t.Fatal(err)
	}
	if got := jsnHeader(t, ctx, nc, bucket, rev, jetstream.MsgTTLHeader); got != "" {
		t.Fatalf("kv.Update kept Nats-TTL %q: nats.go #1994 is fixed; revisit docs/jetstream-notes.md", got)
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + bucket + ".k", Data: []byte("v3")},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got := jsnHeader(t, ctx, nc, bucket, ack.Sequence, jetstream.MsgTTLHeader); got != "1h0m0s" {
		t.Fatalf("CAS publish: Nats-TTL %q, want 1h0m0s", got)
	}
}

// TestJetStreamR3CreateOverTombstoneLosers: on an R3 bucket, several
// kv.Create calls race for a key whose last message is a delete
// tombstone. One wins; the losers are refused, with API error 10071 or
// 10164 (wrong last sequence while another write to the subject is in
// flight). nats.go returns the 10164 of this path as a bare APIError that
// is not ErrKeyExists. A 10164 is not a conflict but "another write in
// flight", whatever becomes of it: the lease package sends such a write
// again until the revision check answers (docs/jetstream-notes.md (c)).
func TestJetStreamR3CreateOverTombstoneLosers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, _, js := threeNodeJS(t, ctx)
	kv, err := createKV(ctx, cl, js, jetstream.KeyValueConfig{Bucket: "JSN_TOMBSTONE", History: 1,
		Storage: jetstream.FileStorage, Replicas: 3, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	jsnWritable(t, ctx, kv)
	const rounds, racers = 20, 8
	codes := map[string]int{}
	for r := range rounds {
		key := fmt.Sprintf("k%d", r)
		if _, err := kv.Put(ctx, key, []byte("old")); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				_, errs[i] = kv.Create(ctx, key, []byte("new"))
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for _, err := range errs {
			var apiErr *jetstream.APIError
			switch {
			case err == nil:
				winners++
			case !errors.As(err, &apiErr):
				t.Errorf("round %d: a loser got %v, not an API error", r, err)
			case apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence &&
				apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant:
				t.Errorf("round %d: a loser got API error %d: %v", r, apiErr.ErrorCode, err)
			default:
				codes[fmt.Sprintf("%d ErrKeyExists=%v", apiErr.ErrorCode, errors.Is(err, jetstream.ErrKeyExists))]++
			}
		}
		if winners != 1 {
			t.Errorf("round %d: %d creates won over the tombstone", r, winners)
		}
	}
	t.Logf("%d rounds x %d creates over a tombstone on R3; losers by API code: %v", rounds, racers, codes)
	if codes[fmt.Sprintf("%d ErrKeyExists=false", jetstream.JSErrCodeStreamWrongLastSequenceConstant)] == 0 {
		t.Errorf("no loser got a bare API error %d: revisit docs/jetstream-notes.md (c) (and whileInFlight in lease/bucket.go)",
			jetstream.JSErrCodeStreamWrongLastSequenceConstant)
	}
}

// TestJetStreamMsgTTLWholeSeconds: the server keeps a per-message TTL in
// whole seconds. Under a second is refused (API error 10165); a fraction
// is dropped, so a key created with a 1.999s TTL expires after 1s, while
// nats.go wrote "1.999s" in its Nats-TTL header. The server expires late,
// never early, but only measured against the truncated TTL: a client
// deadline of send time + TTL holds for whole-second TTLs only.
func TestJetStreamMsgTTLWholeSeconds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const bucket = "JSN_SECONDS"
	nc, _, kv := singleNodeKV(t, ctx, bucket)
	const errTTLInvalid = 10165 // JSMessageTTLInvalidErr; nats.go has no constant for it
	var apiErr *jetstream.APIError
	_, err := kv.Create(ctx, "short", []byte("v"), jetstream.KeyTTL(999*time.Millisecond))
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errTTLInvalid {
		t.Errorf("create with a 999ms TTL: %v, want API error %d", err, errTTLInvalid)
	}

	const ttl = 1999 * time.Millisecond
	rev, err := kv.Create(ctx, "k", []byte("v"), jetstream.KeyTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	created, err := jsnGet(ctx, nc, bucket, map[string]any{"seq": rev})
	if err != nil || !created.found {
		t.Fatalf("get %d: %v", rev, err)
	}
	if got := jsnHeader(t, ctx, nc, bucket, rev, jetstream.MsgTTLHeader); got != ttl.String() {
		t.Fatalf("Nats-TTL %q, want %q", got, ttl)
	}
	var m jsnMsg
	for m.marker == "" {
		if m, err = jsnGet(ctx, nc, bucket, map[string]any{"last_by_subj": "$KV." + bucket + ".k"}); err != nil {
			t.Fatal(err)
		}
		if time.Since(created.time) > 10*time.Second {
			t.Fatalf("no expiry marker 10s after a %v TTL", ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	after := m.time.Sub(created.time)
	t.Logf("a %v TTL expired %v after the create (server times)", ttl, after)
	switch {
	case after < ttl.Truncate(time.Second):
		t.Errorf("expired %v after the create: earlier than the whole seconds of its %v TTL", after, ttl)
	case after >= ttl:
		t.Errorf("expired %v after the create, not before its %v TTL: nats-server no longer truncates TTLs to whole seconds (or its sweep ran a second late): revisit docs/jetstream-notes.md", after, ttl)
	}
}

// noMarkerKVStream is the stream of a KV bucket (History 1) that allows
// per-message TTLs but places no subject delete markers: an expired key
// just disappears. Bind it with js.KeyValue(bucket).
func noMarkerKVStream(bucket string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: "KV_" + bucket, Subjects: []string{"$KV." + bucket + ".>"},
		MaxMsgsPerSubject: 1, MaxBytes: -1, MaxMsgs: -1, MaxMsgSize: -1, MaxConsumers: -1,
		Duplicates: 2 * time.Minute, AllowRollup: true, DenyDelete: true, AllowDirect: true,
		Discard: jetstream.DiscardNew, Replicas: replicas, Storage: jetstream.FileStorage,
		AllowMsgTTL: true, SubjectDeleteMarkerTTL: 0,
	}
}

// singleNodeKV starts one embedded node and creates a KV bucket on it with
// per-key TTLs allowed (LimitMarkerTTL), as the lease bucket is; the node
// and connection end with the test.
func singleNodeKV(t *testing.T, ctx context.Context, bucket string) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
		Storage: jetstream.FileStorage, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, kv
}

// createKV creates a bucket replicated on every node of cl (createR3: once
// the cluster can place it, asking again while the answer means "not
// ready yet") and returns it once every replica is current.
func createKV(ctx context.Context, cl *embedded.Cluster, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := createR3(ctx, cl, js, "KV_"+cfg.Bucket, func(ctx context.Context) error {
		var err error
		if kv, err = js.CreateKeyValue(ctx, cfg); errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // an earlier try's create, answered too late
		}
		return err
	})
	return kv, err
}

// threeNodeJS starts a 3-node embedded cluster and connects to it; both
// end with the test.
func threeNodeJS(t *testing.T, ctx context.Context) (*embedded.Cluster, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	began := time.Now()
	cl, nc := natstest.Cluster(ctx, t, 3)
	t.Logf("3-node cluster ready in %v", time.Since(began).Round(time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return cl, nc, js
}

// serverProc runs an embedded server in a process of its own (this test
// binary, EMBCACHE_WORKER=server) on dir and port, until kill.
func serverProc(t *testing.T, dir string, port int) (url string, kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EMBCACHE_WORKER="+modeServer, "EMBCACHE_STORE="+dir, "EMBCACHE_PORT="+strconv.Itoa(port))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill = func() {
		if !killed {
			killed = true
			cmd.Process.Kill() // SIGKILL: nothing is flushed or written on the way out
			cmd.Wait()
		}
	}
	t.Cleanup(kill)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		kill()
		t.Fatalf("server process: %q %v\n%s", line, err, stderr.String())
	}
	return "nats://127.0.0.1:" + strconv.Itoa(port), kill
}

// TestJetStreamPurgeRevivedAfterAnUncleanStop: on a one-node (R1) KV
// bucket, a key purged with a TTL'd marker comes back, with its value
// from before the purge, after the server is killed and restarted once
// the marker is gone (nats-server #8505, open; v2.15.2 and v2.15.3). The
// test fails when the server stops reviving it: revisit
// docs/jetstream-notes.md (h).
func TestJetStreamPurgeRevivedAfterAnUncleanStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	port, err := embedded.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	url, kill := serverProc(t, dir, port)
	nc := natstest.Connect(t, url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const bucket = "JSN_REVIVE"
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
		Storage: jetstream.FileStorage, LimitMarkerTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		for _, k := range []string{"a", "b"} {
			if _, err := kv.Put(ctx, k, []byte(k+strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := kv.Purge(ctx, "a", jetstream.PurgeTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	for { // polling the server's own expiry of the marker
		_, err := s.GetLastMsgForSubject(ctx, "$KV."+bucket+".a")
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the purge's marker did not expire")
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc.Close()
	kill()
	url, _ = serverProc(t, dir, port)
	nc = natstest.Connect(t, url)
	js, _ = jetstream.New(nc)
	kv, err = js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "a")
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal("the purged key stayed purged across an unclean stop: nats-server #8505 is fixed; revisit docs/jetstream-notes.md (h)")
	}
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Value()) != "a3" {
		t.Fatalf("revived as %q, want its last value before the purge, a3", e.Value())
	}
}
