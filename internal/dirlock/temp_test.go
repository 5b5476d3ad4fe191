package dirlock_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/embcache/embcache/internal/dirlock"
)

const prefix = "demo-run-"

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A directory whose owner closed its lock (a killed process's) is
// removed with what is in it; one whose lock is held, and whatever is not
// a directory of the prefix, is left as it is.
func TestRemoveStaleRemovesOnlyUnlockedDirectories(t *testing.T) {
	parent := t.TempDir()
	live, liveLock, err := dirlock.MkdirTemp(parent, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer liveLock.Close()
	stale, staleLock, err := dirlock.MkdirTemp(parent, prefix)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(live, "value"))
	if err := os.Mkdir(filepath.Join(stale, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(stale, "sub", "value"))
	staleLock.Close() // its owner is gone

	other := filepath.Join(parent, "other-run-1") // another prefix
	target := t.TempDir()                         // an unlocked directory, behind a link of the prefix
	file := filepath.Join(parent, prefix+"file")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(parent, prefix+"link")); err != nil {
		t.Fatal(err)
	}
	write(t, file)
	write(t, filepath.Join(target, "value"))

	removed, err := dirlock.RemoveStale(parent, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{stale}) {
		t.Fatalf("removed %v, want only %s", removed, stale)
	}
	for _, p := range []string{filepath.Join(live, "value"), other, filepath.Join(parent, prefix+"link"),
		filepath.Join(target, "value"), file} {
		if !exists(t, p) {
			t.Fatalf("%s was removed", p)
		}
	}
	if exists(t, stale) {
		t.Fatalf("%s is still there", stale)
	}

	liveLock.Close()
	if removed, err := dirlock.RemoveStale(parent, prefix); err != nil || !slices.Equal(removed, []string{live}) {
		t.Fatalf("once its lock is closed: removed %v (%v), want %s", removed, err, live)
	}
	if removed, err := dirlock.RemoveStale(filepath.Join(parent, "none"), prefix); err != nil || removed != nil {
		t.Fatalf("a parent that does not exist: %v %v", removed, err)
	}
}

// A child process started with the lock (ExtraFiles) holds it after its
// parent closed its own: the directory is live while any process of its
// owner's lives.
func TestRemoveStaleLeavesADirectoryAChildHolds(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command:", err)
	}
	parent := t.TempDir()
	dir, lock, err := dirlock.MkdirTemp(parent, prefix)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(sleep, "600")
	child.ExtraFiles = []*os.File{lock}
	if err := child.Start(); err != nil {
		lock.Close()
		t.Fatal(err)
	}
	lock.Close() // the parent's copy
	removed, err := dirlock.RemoveStale(parent, prefix)
	if err != nil || removed != nil || !exists(t, dir) {
		t.Fatalf("while a child holds the lock: removed %v (%v)", removed, err)
	}
	child.Process.Kill()
	child.Wait()
	if removed, err := dirlock.RemoveStale(parent, prefix); err != nil || !slices.Equal(removed, []string{dir}) {
		t.Fatalf("once the child is gone: removed %v (%v), want %s", removed, err, dir)
	}
}

// MkdirTemp and RemoveStale racing on one parent: a RemoveStale may come
// upon a directory between its making and its locking, but a directory
// MkdirTemp returned is never removed while its lock is held.
func TestMkdirTempRacingRemoveStale(t *testing.T) {
	parent := t.TempDir()
	var done atomic.Bool
	var sweeps sync.WaitGroup
	for range 2 {
		sweeps.Go(func() {
			for !done.Load() {
				if _, err := dirlock.RemoveStale(parent, prefix); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	var makers sync.WaitGroup
	for range 4 {
		makers.Go(func() {
			for range 100 {
				dir, lock, err := dirlock.MkdirTemp(parent, prefix)
				if err != nil {
					t.Error(err)
					return
				}
				// What a demo does with it: files made and read back, while
				// the sweeps go on.
				value := filepath.Join(dir, "value")
				if err := os.WriteFile(value, []byte("x"), 0o600); err != nil {
					t.Errorf("writing in a directory MkdirTemp returned: %v", err)
				} else if _, err := os.ReadFile(value); err != nil {
					t.Errorf("reading in a directory MkdirTemp returned: %v", err)
				}
				os.RemoveAll(dir)
				lock.Close()
			}
		})
	}
	makers.Wait()
	done.Store(true)
	sweeps.Wait()
}
