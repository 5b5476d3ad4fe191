package testproc_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/embcache/embcache/internal/testproc"
)

// The parent gets the lines it waits for, in order, past the others; the
// child runs until the parent's test ends.
func TestLine(t *testing.T) {
	p := testproc.Start(t, "TestChild", "TESTPROC_CHILD=serve")
	if got := p.Line(t, "ready: ", time.Minute); got != "1" {
		t.Fatalf("first ready line: %q", got)
	}
	if got := p.Line(t, "ready: ", time.Minute); got != "2" {
		t.Fatalf("second ready line: %q", got)
	}
}

// A child that exits on its own is waited for.
func TestWait(t *testing.T) {
	p := testproc.Start(t, "TestChild", "TESTPROC_CHILD=exit")
	if got := p.Line(t, "done: ", time.Minute); got != "yes" {
		t.Fatalf("done line: %q", got)
	}
	p.Wait(t, time.Minute)
}

// TestChild is the child of the tests above; it skips as a test of its
// own.
func TestChild(t *testing.T) {
	switch os.Getenv("TESTPROC_CHILD") {
	case "serve":
		fmt.Println("noise")
		fmt.Println("ready: 1")
		fmt.Println("ready: 2")
		testproc.StdinClosed()
	case "exit":
		fmt.Println("done: yes")
	default:
		t.Skip("the child of this package's tests: they run it")
	}
}
