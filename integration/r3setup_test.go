package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/embcache/embcache/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Creating a replicated stream on a fresh embedded cluster, for the tests
// that measure JetStream on R3. The cluster is ready for it once it has
// one meta leader that sees every node and every node's meta layer is
// current (embedded.Cluster.WaitJetStream): until then a create is
// refused, or its proposal is dropped by a meta leader that changes, and
// goes unanswered. The first create is answered by the stream's leader,
// which the stream's new group elects in about a second, or an election
// timeout (4 to 9 s) more when a vote fails, more again on a starved
// machine. A create of the same config again is idempotent, and any
// member answers it as soon as the meta layer applies it, the stream's
// leader elected or not (nats-server 2.15, processClusterCreateStream).
// So a create that went unanswered, or was refused for a reason that
// means "not ready yet" (notReadyYet), is asked again once the cluster is
// ready, any other refusal ends it, and an answered create is followed by
// a wait for the stream's leader and replicas.

// createAttempt bounds one create: a new stream's group elects its leader
// within it unless a vote failed twice.
const createAttempt = 10 * time.Second

// createR3 runs create (the create of stream, replicated on every node of
// cl) until it succeeds, an error other than notReadyYet's, or ctx's end,
// and then waits until the stream has a leader and every replica is
// current. The error it returns on ctx's end says what was not ready:
// the cluster's JetStream, or the stream (unplaced, leaderless, a replica
// behind), and what each try got.
func createR3(ctx context.Context, cl *embedded.Cluster, js jetstream.JetStream, stream string, create func(ctx context.Context) error) error {
	began := time.Now()
	var tries []string // what each unanswered or refused try got
	fail := func(err error) error {
		state := cl.NotReady()
		if state == "" {
			state = streamState(js, stream)
		}
		if state != "" && !strings.Contains(err.Error(), state) {
			err = fmt.Errorf("%w; now: %s", err, state)
		}
		return fmt.Errorf("stream %s not ready after %v: %w; tries that failed: %s",
			stream, time.Since(began).Round(time.Millisecond), err, summarize(tries))
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		if err := cl.WaitJetStream(ctx); err != nil {
			return fail(err)
		}
		actx, cancel := context.WithTimeout(ctx, createAttempt)
		err := create(actx)
		cancel()
		if err == nil {
			break
		}
		why, again := notReadyYet(ctx, err)
		if !again {
			return fail(err)
		}
		tries = append(tries, why)
		t := time.NewTimer(wait) // a back-off between tries, not an ordering
		select {
		case <-ctx.Done():
			t.Stop()
			return fail(fmt.Errorf("the last try: %s: %w", why, ctx.Err()))
		case <-t.C:
		}
	}
	// Answered: by the stream's leader, or (asked again) by any member,
	// a leader elected or not; a replica may still be catching up.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		state := streamState(js, stream)
		if state == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("created, but not ready: %w", ctx.Err()))
		case <-tick.C:
		}
	}
}

// notReadyYet reports whether a create's err means "not ready yet" (the
// cluster has no meta leader, cannot place the stream, or did not answer
// in time), and what it means.
func notReadyYet(ctx context.Context, err error) (string, bool) {
	var apiErr *jetstream.APIError
	switch {
	case ctx.Err() != nil:
		return "", false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Sprintf("unanswered in %v", createAttempt), true
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return "no JetStream answered", true
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case 10004, // JSClusterIncompleteErr: incomplete results
			10005, // JSClusterNoPeersErrF: insufficient resources, no suitable peers
			10007, // JSClusterNotAssignedErr
			10008, // JSClusterNotAvailErr: JetStream system temporarily unavailable
			10009, // JSClusterNotLeaderErr
			10118: // JSStreamOfflineErr
			return fmt.Sprintf("refused: %s (%d)", apiErr.Description, apiErr.ErrorCode), true
		}
	}
	return "", false
}

// streamState says what keeps stream from taking writes on every replica,
// or "" if nothing does.
func streamState(js jetstream.JetStream, stream string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Sprintf("stream %s: %v", stream, err)
	}
	info := s.CachedInfo()
	switch {
	case info.Cluster == nil:
		return fmt.Sprintf("stream %s: no cluster information", stream)
	case info.Cluster.Leader == "":
		return fmt.Sprintf("stream %s: no leader elected", stream)
	}
	var behind []string
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			behind = append(behind, fmt.Sprintf("%s (current %v, offline %v, lag %d)", r.Name, r.Current, r.Offline, r.Lag))
		}
	}
	if len(behind) > 0 || len(info.Cluster.Replicas)+1 != info.Config.Replicas {
		return fmt.Sprintf("stream %s: leader %s, %d other replicas of %d, behind: %v", stream, info.Cluster.Leader,
			len(info.Cluster.Replicas), info.Config.Replicas, behind)
	}
	return ""
}

// summarize counts the tries by what they got: "3 × unanswered in 10s, 1 × ...".
func summarize(tries []string) string {
	if len(tries) == 0 {
		return "none"
	}
	counts := map[string]int{}
	for _, t := range tries {
		counts[t]++
	}
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d × %s", counts[t], t))
	}
	return strings.Join(parts, ", ")
}

// A create on a cluster that is not ready fails with what was not: here
// one node of three, which has no quorum and so no meta leader.
func TestCreateR3SaysWhatIsNotReady(t *testing.T) {
	var routes []string
	var opts []embedded.Options
	for i := range 3 {
		client, err := embedded.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		route, err := embedded.FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(route))
		opts = append(opts, embedded.Options{StoreDir: t.TempDir(), Name: "n" + strconv.Itoa(i+1), Port: client,
			ClusterName: "alone", ClusterPort: route})
	}
	opts[0].Routes = routes
	n1, err := embedded.Start(opts[0]) // its peers never start
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Shutdown()
	nc := natstest.Connect(t, n1.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = createKV(ctx, &embedded.Cluster{Nodes: []*embedded.Server{n1}}, js, jetstream.KeyValueConfig{Bucket: "ALONE", Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "stream KV_ALONE not ready") ||
		!strings.Contains(err.Error(), "no JetStream meta leader among the running nodes [n1]") {
		t.Fatalf("a create on one node of three: %v", err)
	}
	t.Log(err)
}

// What a create's error means: asked again while the cluster is not
// ready, given up on otherwise, and never after the caller's context.
func TestNotReadyYet(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(live)
	cancel()
	for _, c := range []struct {
		ctx   context.Context
		err   error
		again bool
	}{
		{live, fmt.Errorf("create: %w", context.DeadlineExceeded), true},
		{live, nats.ErrNoResponders, true},
		{live, &jetstream.APIError{ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{live, &jetstream.APIError{ErrorCode: 10005, Description: "insufficient resources"}, true},
		{live, &jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}, false},
		{live, errors.New("something else"), false},
		{done, context.DeadlineExceeded, false},
	} {
		if why, again := notReadyYet(c.ctx, c.err); again != c.again || again && why == "" {
			t.Errorf("%v (context %v): again %v (%q), want %v", c.err, c.ctx.Err(), again, why, c.again)
		}
	}
}
