package shm

// Review tests (branch review): attacks on b6e78c2, "payload: a delete
// is of the generation its deleter saw". Each says what it shows.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/embcache/embcache/payload"
)

// TestAGenerationIsNotReusedOnADiskDirectory: a file's Generation
// is its inode number and ctime. A store directory on a disk filesystem
// (ext4 here: t.TempDir, not /dev/shm) reuses the inode number of a file
// just removed, and stamps times by clock tick: a value deleted by one
// deleter and put again by a recompute within one tick can come back with
// the generation a second, stale deleter read before, and that deleter's
// Delete then removes the new file (the value a live record may name).
// The claim under attack (docs/protocol.md 2.4): "any other Put makes a
// new inode", so "a delete of an earlier one leaves the payload".
// Checked: it holds on this machine (Linux 6.18, multigrain ctimes): the
// inode number came back in most rounds, but the ctime told the files
// apart (the deleter's stat made the unlink stamp a fine-grained ctime,
// which raised the floor of the next file's). On a kernel that stamps by
// tick (before 6.13) with the store on a disk filesystem it may not.
func TestAGenerationIsNotReusedOnADiskDirectory(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	reused := 0
	defer func() { t.Logf("inode number reused in %d of 300 rounds (the ctime told them apart)", reused) }()
	for i := range 300 {
		loc, err := s.Put(ctx, obj(40), v)
		if err != nil {
			t.Fatal(err)
		}
		stale, err := s.Generation(ctx, loc) // the second deleter's look, before its record read
		if err != nil {
			t.Fatal(err)
		}
		if err := deleteNow(s, loc); err != nil { // the first deleter
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, obj(40), v); err != nil { // a recompute puts the same bytes (and commits)
			t.Fatal(err)
		}
		fresh, _ := s.Generation(ctx, loc)
		if fresh.ID == stale.ID {
			reused++
		}
		if err := s.Delete(ctx, loc, stale); err != nil { // the second deleter, on what it saw
			t.Fatal(err)
		}
		if _, err := os.Stat(s.Path(obj(40))); err != nil {
			t.Fatalf("round %d: a delete of the generation seen before the value was deleted and put again removed the new file "+
				"(stale %+v, new %+v): %v", i, stale, fresh, err)
		}
		if err := deleteNow(s, loc); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAPutOverACorruptFileLeavesAValueItsLocationCannotRead: keep
// (the "put again" path of Put and Receive) judges "the bytes already in
// place" by the file's size and trailer alone. A file whose data changed
// in place (a flipped byte on tmpfs, trailer intact) is then "put again"
// (a new generation, no write) and Put returns a Location for it, which
// its caller commits; Get of that Location is ErrCorrupt. Put's contract:
// "An object already present with v's bytes is left as it is, but put
// again ...; one with other bytes is replaced." Since b6e78c2, a reader's
// removal of a corrupt file (removeIfSame) also leaves a file put again
// since it hashed it, so a re-put racing that removal keeps the corrupt
// file in place for the record the re-put commits.
func TestAPutOverACorruptFileLeavesAValueItsLocationCannotRead(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	loc, err := s.Put(ctx, obj(41), v)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, s.Path(obj(41)), loc.Size-1) // the last data byte: the trailer is intact
	again, err := s.Put(ctx, obj(41), v)     // a recompute of the same value
	if err != nil || again != loc {
		t.Fatalf("put again: %+v %v", again, err)
	}
	got, err := s.Get(ctx, again)
	if err != nil {
		if errors.Is(err, payload.ErrCorrupt) {
			t.Fatalf("Put returned a Location whose file does not hold the value put (kept on its trailer): %v", err)
		}
		t.Fatal(err)
	}
	got.Close()
}

// lockedByAnotherProcess starts a process (flock(1)) that holds an
// exclusive flock on path until the test ends: any process of the node
// that can open the file can (any local user could while files were 0444
// in 0755 directories; a member of a WithGroup group can), and so
// does a process of the node stopped (SIGSTOP, a debugger, a node paused
// by a fault) inside a Delete or a Put of the key. The process is ended,
// by its id, when the test ends.
func lockedByAnotherProcess(t *testing.T, path string) {
	t.Helper()
	cmd := exec.Command("flock", "-o", "-x", path, "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("flock(1): %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	// Held once a non-blocking lock of ours is refused.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the other process did not take the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAPutOrDeleteEndsWithItsContextWhileAnotherProcessHoldsTheFileLock:
// since b6e78c2 every Put that finds the key's file there, every Delete and
// every reader's removal of a corrupt file takes an exclusive flock of the
// value file, blocking (LOCK_EX, no LOCK_NB, no timeout) and deaf to ctx.
// Another process holding that lock (any local user could while the file
// was 0444 in a 0755 directory, as a WithGroup group's member can; or a
// process of the node stopped inside a Delete)
// holds every Put and Delete of the key, in every process of the node, for
// as long as it likes; ctx does not end them. Before b6e78c2 nothing here
// waited for anyone. (coordinator's TestCloseWaitsForACommitStuckOnAFileLock
// shows what that does to a Cache.)
func TestAPutOrDeleteEndsWithItsContextWhileAnotherProcessHoldsTheFileLock(t *testing.T) {
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	loc, err := s.Put(context.Background(), obj(42), v)
	if err != nil {
		t.Fatal(err)
	}
	lockedByAnotherProcess(t, s.Path(obj(42)))
	for _, op := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Put", func(ctx context.Context) error { _, err := s.Put(ctx, obj(42), v); return err }},
		{"Delete", func(ctx context.Context) error {
			seen, err := s.Generation(ctx, loc)
			if err != nil {
				return err
			}
			return s.Delete(ctx, loc, seen)
		}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- op.do(ctx) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s while another process holds the file's lock: %v, want its ctx's deadline", op.name, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s with a 200ms ctx still blocked after 5s: it waits for another process's flock of the value file, whatever its ctx", op.name)
		}
		cancel()
	}
	// The test's cleanup ends the holder: the blocked calls return then.
}

// TestADeleteOfNoFileSeenLeavesAFilePutSince: a deleter whose
// generation read found no file (the zero Generation) and that deletes
// anyway, after a Put of the key, leaves the file put since. (Checked: it
// holds.)
func TestADeleteOfNoFileSeenLeavesAFilePutSince(t *testing.T) {
	ctx := context.Background()
	s, err := Open(testDir(t))
	if err != nil {
		t.Fatal(err)
	}
	v := testValue(1000)
	enc, _ := payload.Encode(v)
	sum, _ := payload.Sum(v)
	loc := payload.Location{Transport: payload.TransportShm, Node: s.Node(), Address: s.Dir(), Object: obj(43).String(),
		Size: int64(len(enc)), Checksum: sum}
	seen, err := s.Generation(ctx, loc)
	if err != nil || seen != (payload.Generation{}) {
		t.Fatalf("generation of no file: %+v %v", seen, err)
	}
	if _, err := s.Put(ctx, obj(43), v); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, loc, seen); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Path(obj(43))); err != nil {
		t.Fatalf("a delete of no file seen removed the file put since: %v", err)
	}
	m := payload.NewMemoryStore("n", 0)
	seen, _ = m.Generation(ctx, loc)
	mloc, err := m.Put(ctx, obj(43), v)
	if err != nil {
		t.Fatal(err)
	}
	m.Delete(ctx, mloc, seen)
	if _, err := m.Open(ctx, obj(43)); err != nil {
		t.Fatalf("MemoryStore: a delete of no object seen removed the object put since: %v", err)
	}
}
