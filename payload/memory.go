package payload

import (
	"context"
	"fmt"
	"sync"
)

// MemoryStore is a Transport that keeps encodings in this process's
// memory: the source an httppull server serves from on a node without
// shm, and a reference transport for tests. Safe for concurrent use.
type MemoryStore struct {
	node     string
	maxBytes int64

	mu      sync.Mutex
	objects map[ObjectID]memObject // guarded by mu
	puts    uint64                 // Puts so far; guarded by mu
	bytes   int64                  // guarded by mu
}

// memObject is a stored encoding and its Generation.ID: the number of
// the Put that made or kept it.
type memObject struct {
	*Blob
	put uint64
}

// NewMemoryStore returns a store for node that holds at most maxBytes of
// encodings (0 means no limit).
func NewMemoryStore(node string, maxBytes int64) *MemoryStore {
	return &MemoryStore{node: node, maxBytes: maxBytes, objects: make(map[ObjectID]memObject)}
}

// Put encodes v and keeps it under obj, in a new Generation (the same
// bytes too). The error is ErrNoSpace over the budget, ErrInvalidValue for a bad
// value.
func (m *MemoryStore) Put(_ context.Context, obj ObjectID, v *Value) (Location, error) {
	if err := obj.Validate(); err != nil {
		return Location{}, err
	}
	enc, err := Encode(v)
	if err != nil {
		return Location{}, err
	}
	sum := sumParts(enc, nil)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.puts++
	if old, ok := m.objects[obj]; ok {
		if old.Checksum == sum {
			old.put = m.puts // put again: a delete of what was seen before leaves it
			m.objects[obj] = old
			return m.location(obj, len(old.Data), old.Checksum), nil
		}
		m.bytes -= int64(len(old.Data)) // other bytes: replaced (Transport)
		delete(m.objects, obj)
	}
	if m.maxBytes > 0 && m.bytes+int64(len(enc)) > m.maxBytes {
		return Location{}, fmt.Errorf("%w: %d bytes held, %d more exceed %d", ErrNoSpace, m.bytes, len(enc), m.maxBytes)
	}
	m.objects[obj] = memObject{NewBlob(enc, sum, nil), m.puts}
	m.bytes += int64(len(enc))
	return m.location(obj, len(enc), sum), nil
}

func (m *MemoryStore) location(obj ObjectID, size int, sum Checksum) Location {
	return Location{Transport: TransportMemory, Node: m.node, Object: obj.String(), Size: int64(size), Checksum: sum}
}

// Get returns the value at loc, verified.
func (m *MemoryStore) Get(ctx context.Context, loc Location) (*Value, error) {
	if err := loc.Validate(); err != nil {
		return nil, err
	}
	obj, _ := loc.ObjectID()
	b, err := m.Open(ctx, obj)
	if err != nil {
		return nil, err
	}
	return Verify(b.Data, loc.Size, loc.Checksum)
}

// Open returns the stored encoding of obj (for an httppull server).
func (m *MemoryStore) Open(_ context.Context, obj ObjectID) (*Blob, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objects[obj]
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, obj)
	}
	return NewBlob(b.Data, b.Checksum, nil), nil
}

// Generation returns the generation of loc's object (the zero Generation
// if it is absent).
func (m *MemoryStore) Generation(_ context.Context, loc Location) (Generation, error) {
	obj, err := loc.ObjectID()
	if err != nil {
		return Generation{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return Generation{ID: m.objects[obj].put}, nil
}

// Delete drops the object at loc if it holds loc's bytes in generation
// seen (Transport).
func (m *MemoryStore) Delete(_ context.Context, loc Location, seen Generation) error {
	obj, err := loc.ObjectID()
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.objects[obj]; ok && b.Checksum == loc.Checksum && b.put == seen.ID {
		m.bytes -= int64(len(b.Data))
		delete(m.objects, obj)
	}
	return nil
}

// Bytes returns the bytes held.
func (m *MemoryStore) Bytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

var _ Transport = (*MemoryStore)(nil)
