//go:build !linux

package demo

import "syscall"

// dieWithParent: only Linux kills a child with its parent. Elsewhere a
// worker outlives a killed demo until it reads the end of its stdin (the
// demo's end of the pipe closes with it), holding the demo's directories
// until then.
func dieWithParent() *syscall.SysProcAttr { return nil }
