// Package syncbuf is a bytes buffer that one goroutine may read while
// others write to it: a child process's output (exec copies it on a
// goroutine of its own), or a logger's, that a test reads as it goes.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose Write and String are safe for
// concurrent use. The zero value is an empty buffer.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n bytes written so far.
func (b *Buffer) Tail(n int) string {
	s := b.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
