package shm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/testproc"
	"github.com/embcache/embcache/internal/workload"
	"github.com/embcache/embcache/payload"
)

// The cross-process get of the three transports, reported the same way
// (workload.AgainstBareTCP): this one, payload/httppull's
// BenchmarkCrossProcessGet and payload/mooncake's BenchmarkRealMooncakeGet,
// each at 1, 8 and 100 MiB.

// putInAnotherProcess runs this test binary again as a writer
// (TestCrossProcessWriter), which puts workload.PatternValue(size) into the store in
// dir, as a process of the node does, and exits; it returns the Location.
func putInAnotherProcess(tb testing.TB, dir string, size int) payload.Location {
	tb.Helper()
	p := testproc.Start(tb, "TestCrossProcessWriter", "EMBCACHE_SHM_WRITER_DIR="+dir, "EMBCACHE_SHM_WRITER_SIZE="+strconv.Itoa(size))
	var loc payload.Location
	if err := json.Unmarshal([]byte(p.Line(tb, "location: ", time.Minute)), &loc); err != nil {
		tb.Fatal(err)
	}
	p.Wait(tb, time.Minute)
	return loc
}

// TestCrossProcessWriter is the writer putInAnotherProcess runs; it skips
// as a test of its own.
func TestCrossProcessWriter(t *testing.T) {
	dir := os.Getenv("EMBCACHE_SHM_WRITER_DIR")
	if dir == "" {
		t.Skip("the writer of BenchmarkCrossProcessGet: it runs it")
	}
	size, err := strconv.Atoi(os.Getenv("EMBCACHE_SHM_WRITER_SIZE"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := s.Put(context.Background(), obj(9), workload.PatternValue(size))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(loc)
	fmt.Printf("location: %s\n", raw)
}

// crossTimes is what crossProcessGets measured.
type crossTimes struct {
	loc            payload.Location
	get, read, tcp time.Duration
	rounds, hashed int  // hashed: files the readers hashed (0: they trusted the writer's proof)
	bytesAsWritten bool // the last get's bytes, and the last read's, are the writer's
}

// crossProcessGets: another process puts a value of size bytes into a
// store in a directory on tmpfs; then each round a new store of this
// process (a reader process's first get of the file) gets it (get: it maps
// the file and checks its trailer against the writer's proof, docs/
// protocol.md 2.3) and reads every byte of it into a buffer of its own
// (read: get and that pass, where the mapping's pages are first touched),
// alternately with the same number of bytes over bare loopback TCP. A last
// get checks the bytes against what the writer put.
func crossProcessGets(tb testing.TB, size int, more func() bool) crossTimes {
	tb.Helper()
	ctx := context.Background()
	dir := testDir(tb)
	var c crossTimes
	c.loc = putInAnotherProcess(tb, dir, size)
	dst := make([]byte, size)
	var err error
	c.get, c.tcp, c.rounds, err = workload.AgainstBareTCP(int(c.loc.Size), more, func() (time.Duration, error) {
		reader, err := Open(dir)
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		v, err := reader.Get(ctx, c.loc)
		if err != nil {
			return 0, err
		}
		t1 := time.Now()
		copy(dst, v.Tensor.Data)
		c.read += time.Since(t0)
		c.hashed += int(reader.hashes.Load())
		return t1.Sub(t0), v.Close()
	})
	if err != nil {
		tb.Fatal(err)
	}
	reader, err := Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	v, err := reader.Get(ctx, c.loc)
	if err != nil {
		tb.Fatal(err)
	}
	defer v.Close()
	c.bytesAsWritten = bytes.Equal(v.Tensor.Data, workload.PatternValue(size).Tensor.Data) && bytes.Equal(dst, v.Tensor.Data)
	return c
}

// BenchmarkCrossProcessGet: a value another process put on this node, got
// by this one, at 1, 8 and 100 MiB, against bare loopback TCP in the same
// run (x-bare-tcp: the get, a map; x-bare-tcp-read: the get and a read of
// every byte into a buffer, as the baseline has them).
func BenchmarkCrossProcessGet(b *testing.B) {
	for _, size := range []int{1 << 20, 8 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			c := crossProcessGets(b, size, b.Loop)
			if !c.bytesAsWritten || c.hashed != 0 {
				b.Fatalf("bytes as written: %v; files hashed by the readers: %d, want 0 (the writer's proof)", c.bytesAsWritten, c.hashed)
			}
			workload.ReportAgainstBareTCP(b, "get", int(c.loc.Size), c.rounds, c.get, c.tcp)
			workload.ReportAgainstBareTCP(b, "read", int(c.loc.Size), c.rounds, c.read, c.tcp)
		})
	}
}

// The benchmark's code runs (one round of 64 KiB): the reader gets the
// bytes the other process put, trusting its proof.
func TestCrossProcessGetRuns(t *testing.T) {
	once := true
	c := crossProcessGets(t, 64<<10, func() bool { r := once; once = false; return r })
	if c.rounds != 1 || c.get <= 0 || c.read < c.get || c.tcp <= 0 {
		t.Fatalf("rounds %d, get %v, read %v, tcp %v", c.rounds, c.get, c.read, c.tcp)
	}
	if !c.bytesAsWritten || c.hashed != 0 {
		t.Fatalf("bytes as written: %v; files hashed by the readers: %d, want 0", c.bytesAsWritten, c.hashed)
	}
}
