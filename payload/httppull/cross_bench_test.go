package httppull

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/testproc"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
	"github.com/embcache/embcache/payload/shm"
)

// The cross-process get of the three transports, reported the same way
// (workload.AgainstBareTCP): this one, payload/shm's
// BenchmarkCrossProcessGet and payload/mooncake's BenchmarkRealMooncakeGet,
// each at 1, 8 and 100 MiB.

// serveFromAnotherProcess runs this test binary again as a node's process
// (TestCrossProcessServer) that puts workload.PatternValue(size) into its shm store
// and serves it on a loopback pull server, as a node that writes http
// values does, until the test ends; it returns the value's Location.
func serveFromAnotherProcess(tb testing.TB, size int) payload.Location {
	tb.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "embcache-test-")
	if err != nil {
		dir = tb.TempDir()
	} else {
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	p := testproc.Start(tb, "TestCrossProcessServer", "EMBCACHE_PULL_SERVER_DIR="+dir, "EMBCACHE_PULL_SERVER_SIZE="+strconv.Itoa(size))
	var loc payload.Location
	if err := json.Unmarshal([]byte(p.Line(tb, "location: ", time.Minute)), &loc); err != nil {
		tb.Fatal(err)
	}
	return loc
}

// TestCrossProcessServer is the process serveFromAnotherProcess runs; it
// skips as a test of its own.
func TestCrossProcessServer(t *testing.T) {
	dir := os.Getenv("EMBCACHE_PULL_SERVER_DIR")
	if dir == "" {
		t.Skip("the server of BenchmarkCrossProcessGet: it runs it")
	}
	size, err := strconv.Atoi(os.Getenv("EMBCACHE_PULL_SERVER_SIZE"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := shm.Open(dir, shm.WithNode("writer"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: newServer(t, store), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	defer srv.Close()
	tr, err := NewTransport("writer", "http://"+l.Addr().String(), store)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := tr.Put(context.Background(), testObj, workload.PatternValue(size))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(loc)
	fmt.Printf("location: %s\n", raw)
	testproc.StdinClosed()
}

// crossProcessGets: another process puts a value of size bytes and serves
// it; this one pulls it (a Reader, as a node that writes with another
// transport reads http values: checksum verified as it streams),
// alternately with the same number of bytes over bare loopback TCP. It
// returns the location, the times, the rounds, and whether the last
// pull's bytes are what the other process put.
func crossProcessGets(tb testing.TB, size int, more func() bool) (loc payload.Location, tGet, tTCP time.Duration, rounds int, asWritten bool) {
	tb.Helper()
	ctx := context.Background()
	loc = serveFromAnotherProcess(tb, size)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	r, err := NewReader(WithHTTPClient(client))
	if err != nil {
		tb.Fatal(err)
	}
	var last []byte
	tGet, tTCP, rounds, err = workload.AgainstBareTCP(int(loc.Size), more, func() (time.Duration, error) {
		t0 := time.Now()
		v, err := r.Get(ctx, loc)
		if err != nil {
			return 0, err
		}
		d := time.Since(t0)
		last = append(last[:0], v.Tensor.Data...)
		return d, v.Close()
	})
	if err != nil {
		tb.Fatal(err)
	}
	return loc, tGet, tTCP, rounds, bytes.Equal(last, workload.PatternValue(size).Tensor.Data)
}

// BenchmarkCrossProcessGet: a value another process serves, pulled over
// loopback HTTP and verified, at 1, 8 and 100 MiB, against bare loopback
// TCP in the same run (x-bare-tcp).
func BenchmarkCrossProcessGet(b *testing.B) {
	for _, size := range []int{1 << 20, 8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			loc, tGet, tTCP, rounds, ok := crossProcessGets(b, size, b.Loop)
			if !ok {
				b.Fatal("the pulled bytes are not the ones the other process put")
			}
			workload.ReportAgainstBareTCP(b, "get", int(loc.Size), rounds, tGet, tTCP)
		})
	}
}

// The benchmark's code runs (one round of 64 KiB) and pulls the bytes the
// other process put.
func TestCrossProcessGetRuns(t *testing.T) {
	once := true
	_, tGet, tTCP, rounds, ok := crossProcessGets(t, 64<<10, func() bool { r := once; once = false; return r })
	if rounds != 1 || tGet <= 0 || tTCP <= 0 || !ok {
		t.Fatalf("rounds %d, get %v, tcp %v, bytes as put: %v", rounds, tGet, tTCP, ok)
	}
}
