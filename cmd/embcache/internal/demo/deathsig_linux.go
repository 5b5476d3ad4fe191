package demo

import "syscall"

// dieWithParent has a worker killed when the demo dies, even by SIGKILL,
// so that nothing writes in the demo's directories once it is gone. The
// kernel sends the signal when the thread that started the worker ends:
// the Go runtime ends a thread only when a goroutine locked to it
// (runtime.LockOSThread) returns, and the demo starts its workers from
// no such goroutine.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
