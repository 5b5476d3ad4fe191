// Package localdirtest lets a test running as root act as another local
// user: it runs one file operation (As), or serves a Unix socket
// (ServeAs), in a child process with that user's credentials
// (syscall.Credential), the test binary itself re-executed from a
// directory that user may run it from. A test package that uses it calls
// Main first in its TestMain.
package localdirtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Nobody is the other local user the tests act as: nobody, group nogroup.
const Nobody = 65534

// The operations As runs.
const (
	Read   = "read"   // open a file and read a byte
	List   = "list"   // read a directory's names
	Write  = "write"  // open an existing file for writing
	Create = "create" // create a file that does not exist (O_EXCL)
	Dial   = "dial"   // connect to a Unix socket
)

const (
	envOp   = "EMBCACHE_LOCALDIRTEST_OP"
	envPath = "EMBCACHE_LOCALDIRTEST_PATH"
)

// Main runs the operation the environment names and exits, in a child As
// started; anywhere else it returns at once.
func Main() {
	op := os.Getenv(envOp)
	if op == "" {
		return
	}
	if op == serveOp {
		serve(os.Getenv(envPath))
		os.Exit(0)
	}
	err := do(op, os.Getenv(envPath))
	var errno syscall.Errno
	switch {
	case err == nil:
		fmt.Println("ok")
	case errors.As(err, &errno):
		fmt.Println("errno", int(errno))
	default:
		fmt.Println("error", err)
	}
	os.Exit(0)
}

func do(op, path string) error {
	switch op {
	case Read:
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Read(make([]byte, 1))
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return err
	case List:
		_, err := os.ReadDir(path)
		return err
	case Write:
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return f.Close()
	case Create:
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		return f.Close()
	case Dial:
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("unknown operation %q", op)
}

// Dir returns a new directory that other users may search (0755, in
// os.TempDir, which t.TempDir's 0700 directories are not), removed when
// the test ends.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "localdirtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// As runs op on path as user uid with group gid (and no other group) in
// a child process, and returns what it returned: nil, a syscall.Errno
// (errors.Is(err, fs.ErrPermission) for a refusal), or another error. It
// needs root.
func As(t testing.TB, uid, gid int, op, path string) error {
	t.Helper()
	cmd := command(t, uid, gid, op, path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s as uid %d: %v: %s", op, path, uid, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	switch {
	case last == "ok":
		return nil
	case strings.HasPrefix(last, "errno "):
		n, err := strconv.Atoi(strings.TrimPrefix(last, "errno "))
		if err != nil {
			t.Fatalf("%s %s as uid %d: %s", op, path, uid, out)
		}
		return syscall.Errno(n)
	case strings.HasPrefix(last, "error "):
		return errors.New(strings.TrimPrefix(last, "error "))
	}
	t.Fatalf("%s %s as uid %d: %s", op, path, uid, out)
	return nil
}

// command is the test binary, run as user uid with group gid (and no
// other group), from a directory that user may run it from, set to run
// op on path. It needs root.
func command(t testing.TB, uid, gid int, op, path string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as another user")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary lies in go's build directory (0700): a link to it
	// in a directory the other user may search, or a copy.
	dir, err := os.MkdirTemp("", "localdirtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "test")
	if err := os.Link(exe, bin); err != nil {
		b, err := os.ReadFile(exe)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), envOp+"="+op, envPath+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	return cmd
}

// serveOp is the operation ServeAs runs.
const serveOp = "serve"

// ServeAs listens on the Unix socket path as user uid with group gid in
// a child process, and answers every HTTP request 200 with the body
// "{}" and the request's Embcache-* headers, until the test ends: a process of another user on a socket. It
// needs root.
func ServeAs(t testing.TB, uid, gid int, path string) {
	t.Helper()
	cmd := command(t, uid, gid, serveOp, path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "listening\n" {
		t.Fatalf("serving %s as uid %d: %q, %v", path, uid, line, err)
	}
}

// serve is ServeAs's child.
func serve(path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	defer l.Close()
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name, v := range r.Header { // the call's names, echoed as an agent does
			if strings.HasPrefix(name, "Embcache-") {
				w.Header()[name] = v
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
	}))
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin) // until the test ends
}

// Squat makes dir as another user (Nobody) would before embcache, with
// mode (a set-group-ID or sticky bit included). It skips a test that does
// not run as root, which alone can give a directory to another user.
func Squat(t testing.TB, dir string, mode uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a directory to another user")
	}
	if err := os.Mkdir(dir, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, Nobody, Nobody); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// ModeOf is path's permission bits (set-ID and sticky bits included) and
// group, not following a link.
func ModeOf(t testing.TB, path string) (mode, gid uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777, st.Gid
}
