package embedded

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartRestartKeepsData(t *testing.T) {
	ctx := context.Background()
	s, err := Start(Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	s2, err := Start(Options{StoreDir: t.TempDir()}) // two servers, one process
	if err != nil {
		t.Fatal(err)
	}
	s2.Shutdown()

	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	s.Shutdown()
	s.Shutdown() // idempotent
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	nc, err = s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	kv, err = js.KeyValue(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v" {
		t.Fatalf("after restart: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("restart of a running server succeeded")
	}
}

func TestAuth(t *testing.T) {
	s, err := Start(Options{StoreDir: t.TempDir(), Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("u", "wrong")); err == nil {
		nc.Close()
		t.Fatal("wrong password accepted")
	}
}

func TestClusterR3SurvivesLeaderLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := StartCluster(ctx, 3, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	nc, err := c.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "T", Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	leader, err := c.StreamLeader(ctx, js, "KV_T")
	if err != nil {
		t.Fatal(err)
	}
	leader.Shutdown()
	var rev uint64
	for rev == 0 { // writes resume once a new leader is elected
		attempt, cancelAttempt := context.WithTimeout(ctx, 2*time.Second)
		rev, err = kv.Put(attempt, "k", []byte("v2"))
		cancelAttempt()
		if err != nil && ctx.Err() != nil {
			t.Fatalf("no write after leader loss: %v", err)
		}
	}
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v2" {
		t.Fatalf("after failover: %v", err)
	}
}
