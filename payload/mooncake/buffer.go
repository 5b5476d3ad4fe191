//go:build mooncake && cgo

package mooncake

import (
	"context"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/embcache/embcache/payload"
)

// buffer returns a registered buffer of at least n bytes.
func (s *Store) buffer(ctx context.Context, n int) (unsafe.Pointer, int, error) {
	class := bits.Len(uint(n - 1))
	s.mu.Lock()
	if free := s.buffers[class]; len(free) > 0 {
		p := free[len(free)-1]
		s.buffers[class] = free[:len(free)-1]
		s.mu.Unlock()
		return p, class, nil
	}
	s.mu.Unlock()
	size := uint64(1) << class
	p := allocBuffer(size)
	if p == nil {
		return nil, 0, fmt.Errorf("%w: cannot allocate a %d-byte buffer", payload.ErrNoSpace, size)
	}
	if rc := s.lib.registerBuffer(p, size); rc != 0 {
		freeBuffer(p)
		return nil, 0, s.masterCheck(ctx, &CodeError{Op: "register_buffer", Code: rc})
	}
	s.mu.Lock()
	s.owned = append(s.owned, p)
	s.mu.Unlock()
	return p, class, nil
}

func (s *Store) putBuffer(p unsafe.Pointer, class int) {
	s.mu.Lock()
	s.buffers[class] = append(s.buffers[class], p)
	s.mu.Unlock()
}
