package localcache

import (
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Value is what the cache holds. Size is its weight against the byte budget.
// Values are shared between holders, not copied: treat them as immutable.
type Value interface {
	Size() int64
}

// Cache is an LRU cache by bytes and entries, with TTLs, pins per request
// and single-flight computes. All methods are safe for concurrent use.
type Cache[K comparable, V Value] struct {
	s          settings
	onEvict    func(K, V, Cause)
	clone      func(V) V
	checksum   func(V) uint64
	onMutation func(K)
	expiry     func(K, V) (time.Time, bool)

	mu sync.Mutex
	// lru holds every entry in the index, pinned or not, in recency order.
	// Eviction skips pinned entries; its own count limit is never reached.
	lru      *simplelru.LRU[K, *entry[V]] // guarded by mu
	pinned   int                          // entries in lru with pins; guarded by mu
	requests map[string]*pinSet[V]        // pins per request; guarded by mu
	free     []*pinSet[V]                 // released pin sets for reuse; guarded by mu
	flights  map[K]*flight[V]             // guarded by mu
	bytes    int64                        // bytes of every entry held; guarded by mu
	stats    Stats                        // counters; guarded by mu
}

// pinSet is the pins of one request: an entry appears once per pin.
type pinSet[V Value] struct{ entries []*entry[V] }

type entry[V Value] struct {
	key     any // K; kept so a detached entry can still be reported
	value   V
	size    int64
	expires time.Time
	fixed   bool // expires is the value's own (Options.Expiry): hits do not extend it
	pins    int
	// detached: removed from the index while pinned (invalidated or
	// expired); it is dropped, with this cause, on its final release.
	detached Cause
	sum      uint64
}

// New returns an empty cache. An option out of range is ErrInvalidOption
// (Options.Validate).
func New[K comparable, V Value](o Options[K, V]) (*Cache[K, V], error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &Cache[K, V]{
		s:        o.settings(),
		onEvict:  o.OnEvict,
		clone:    o.CloneOnGet,
		checksum: o.Checksum, onMutation: o.OnMutation,
		expiry:   o.Expiry,
		requests: make(map[string]*pinSet[V]),
		flights:  make(map[K]*flight[V]),
	}
	lru, err := simplelru.NewLRU[K, *entry[V]](math.MaxInt32, nil)
	if err != nil {
		return nil, err
	}
	c.lru = lru
	return c, nil
}

// eviction is an entry that left the cache, reported after unlocking.
type eviction[K comparable, V Value] struct {
	key   K
	value V
	cause Cause
}

// Get returns the live entry for key and pins it for req. An expired entry
// is a miss. The error is ErrNoRequest for an empty req.
func (c *Cache[K, V]) Get(req string, key K) (V, bool, error) {
	var zero V
	if req == "" {
		return zero, false, ErrNoRequest
	}
	c.mu.Lock()
	e, evicted := c.lookupLocked(key)
	if e == nil {
		c.stats.Misses++
		c.unlockAndReport(evicted)
		return zero, false, nil
	}
	c.stats.Hits++
	c.pinLocked(req, e, 1)
	v := e.value
	c.unlockAndReport(evicted)
	return c.out(v), true, nil
}

// Contains reports whether key has a live entry, without pinning it or
// changing its recency.
func (c *Cache[K, V]) Contains(key K) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, _ := c.lru.Peek(key)
	return e != nil && !c.expiredLocked(e)
}

// Put inserts value under key. With a request id the entry goes in pinned
// for that request (the compute path: no window in which it is unpinned);
// with "" it goes in unpinned. Keys are content addresses, so if key is
// already present the first value stays and is pinned instead.
// The error is ErrInvalidValue for a nil value or a negative size, and
// ErrTooLarge if the value exceeds the byte budget (or, with a budget near
// math.MaxInt64, if pinned entries leave the byte count no room for it).
func (c *Cache[K, V]) Put(req string, key K, value V) error {
	size, err := c.sizeOf(value)
	if err != nil {
		return err
	}
	c.mu.Lock()
	e, evicted := c.lookupLocked(key)
	if e == nil {
		if evicted, err = c.roomLocked(size, evicted); err != nil {
			c.unlockAndReport(evicted)
			return err
		}
		e = c.insertLocked(key, value, size)
	}
	if req != "" {
		c.pinLocked(req, e, 1)
	}
	c.unlockAndReport(c.enforceLocked(evicted, 0))
	return nil
}

// Release drops every pin that req holds and returns how many it dropped.
// Entries left unpinned become evictable; an expired or invalidated one
// goes now.
func (c *Cache[K, V]) Release(req string) int {
	c.mu.Lock()
	set := c.requests[req]
	if set == nil {
		c.mu.Unlock()
		return 0
	}
	delete(c.requests, req)
	var evicted []eviction[K, V]
	var mutated []K
	for _, e := range set.entries {
		if e.pins--; e.pins > 0 {
			continue
		}
		key := e.key.(K)
		if c.checksum != nil && c.checksum(e.value) != e.sum {
			c.stats.Mutations++
			mutated = append(mutated, key)
		}
		switch {
		case e.detached != 0:
			c.bytes -= e.size
			evicted = append(evicted, eviction[K, V]{key, e.value, e.detached})
		case c.expiredLocked(e):
			c.pinned--
			c.lru.Remove(key)
			c.bytes -= e.size
			evicted = append(evicted, eviction[K, V]{key, e.value, CauseTTL})
		default:
			c.pinned--
		}
	}
	n := len(set.entries)
	if len(c.free) < 1024 {
		clear(set.entries)
		set.entries = set.entries[:0]
		c.free = append(c.free, set)
	}
	c.unlockAndReport(c.enforceLocked(evicted, 0))
	if c.onMutation != nil {
		for _, k := range mutated {
			c.onMutation(k)
		}
	}
	return n
}

// Remove drops key now (cause explicit); if pinned, it leaves the index now
// and is dropped on its final release. It reports whether key was present.
func (c *Cache[K, V]) Remove(key K) bool { return c.Evict(key, CauseExplicit) }

// Evict drops key's entry now, with the given cause (expired or not; if
// pinned, it is dropped on its final release), in O(1), and reports
// whether there was one. Unlike Invalidate it leaves a compute running for
// key alone: its value is newer than the entry. A cause that is none of
// the named ones (the zero Cause included) is taken as CauseExplicit.
func (c *Cache[K, V]) Evict(key K, cause Cause) bool {
	cause = cause.named()
	c.mu.Lock()
	e, ok := c.lru.Peek(key)
	if !ok {
		c.mu.Unlock()
		return false
	}
	var evicted []eviction[K, V]
	c.detachLocked(key, e, cause, &evicted)
	c.unlockAndReport(evicted)
	return true
}

// detachLocked takes e out of the index: dropped now if unpinned
// (appended to evicted), else when its holders release it.
func (c *Cache[K, V]) detachLocked(key K, e *entry[V], cause Cause, evicted *[]eviction[K, V]) {
	c.lru.Remove(key)
	if e.pins > 0 {
		c.pinned--
		e.detached = cause
		return
	}
	c.bytes -= e.size
	*evicted = append(*evicted, eviction[K, V]{key, e.value, cause})
}

// Invalidate drops every entry for which match returns true, with the given
// cause (CauseInvalidated for a weight update, CauseStore for a store
// eviction). Pinned matches leave the index at once, so no new request gets
// them, and are dropped when their holders release them. A compute running
// for a key that matches (match is called with the zero V) still answers
// its waiters, but its value never enters the index: it was read before the
// invalidation. It returns how many entries matched. match runs under the
// cache's lock: keep it cheap and do not call the cache. A nil match
// matches nothing; a cause that is none of the named ones (the zero Cause
// included) is taken as CauseExplicit.
func (c *Cache[K, V]) Invalidate(match func(K, V) bool, cause Cause) int {
	if match == nil {
		return 0
	}
	cause = cause.named()
	c.mu.Lock()
	var zero V
	for k, f := range c.flights {
		if match(k, zero) {
			f.discard = cause
		}
	}
	var evicted []eviction[K, V]
	n := 0
	for _, k := range c.lru.Keys() {
		e, _ := c.lru.Peek(k)
		if !match(k, e.value) {
			continue
		}
		n++
		c.detachLocked(k, e, cause, &evicted)
	}
	c.unlockAndReport(evicted)
	return n
}

// Touch extends key's expiry to at least expires (the store's TTL was
// extended elsewhere) and reports whether key was live.
func (c *Cache[K, V]) Touch(key K, expires time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, _ := c.lru.Peek(key)
	if e == nil || c.expiredLocked(e) {
		return false
	}
	if expires.After(e.expires) {
		e.expires = expires
	}
	return true
}

// Sweep drops every unpinned entry whose TTL has run out and returns how
// many it dropped. Expired entries are also dropped lazily on access.
func (c *Cache[K, V]) Sweep() int {
	c.mu.Lock()
	var evicted []eviction[K, V]
	for _, k := range c.lru.Keys() {
		if e, _ := c.lru.Peek(k); e.pins == 0 && c.expiredLocked(e) {
			c.lru.Remove(k)
			c.bytes -= e.size
			evicted = append(evicted, eviction[K, V]{k, e.value, CauseTTL})
		}
	}
	c.unlockAndReport(evicted)
	return len(evicted)
}

// lookupLocked returns the live entry for key, refreshing its recency and
// TTL, or nil. An expired unpinned entry found on the way is removed and
// returned for reporting.
func (c *Cache[K, V]) lookupLocked(key K) (*entry[V], []eviction[K, V]) {
	e, ok := c.lru.Get(key)
	if !ok {
		return nil, nil
	}
	now := c.s.clock.Now()
	if now.After(e.expires) {
		c.lru.Remove(key)
		if e.pins > 0 {
			// Out of the index, so a new value can take the key; the
			// holders keep theirs until their final release.
			c.pinned--
			e.detached = CauseTTL
			return nil, nil
		}
		c.bytes -= e.size
		return nil, []eviction[K, V]{{key, e.value, CauseTTL}}
	}
	// A hit slides the TTL on, but never back before what Touch gave.
	if t := now.Add(c.s.ttl); !e.fixed && t.After(e.expires) {
		e.expires = t
	}
	return e, nil
}

func (c *Cache[K, V]) expiredLocked(e *entry[V]) bool {
	return c.s.clock.Now().After(e.expires)
}

// sizeOf returns v's size: ErrInvalidValue if v is nil, its size is
// negative or its Size panics, ErrTooLarge if it exceeds the byte budget.
// It runs in Put's caller and in a compute's goroutine, where a panic
// would take the process down.
func (c *Cache[K, V]) sizeOf(v V) (size int64, err error) {
	if isNil(v) {
		return 0, fmt.Errorf("%w: nil %T", ErrInvalidValue, v)
	}
	defer func() {
		if r := recover(); r != nil {
			size, err = 0, fmt.Errorf("%w: Size of %T panicked: %v", ErrInvalidValue, v, r)
		}
	}()
	switch size = v.Size(); {
	case size < 0:
		return 0, fmt.Errorf("%w: negative size %d", ErrInvalidValue, size)
	case size > c.s.maxBytes:
		return 0, fmt.Errorf("%w: %d bytes, budget %d", ErrTooLarge, size, c.s.maxBytes)
	}
	return size, nil
}

// isNil reports whether v is a nil interface, pointer, map, channel or
// function. A nil slice is an empty value, not a missing one.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

// roomLocked is for a budget near math.MaxInt64: if size more bytes would
// wrap the byte count, it evicts unpinned entries first, as enforceLocked
// would once they were in, and it returns ErrTooLarge if pinned entries
// leave no room.
func (c *Cache[K, V]) roomLocked(size int64, evicted []eviction[K, V]) ([]eviction[K, V], error) {
	if size <= math.MaxInt64-c.bytes {
		return evicted, nil
	}
	if evicted = c.enforceLocked(evicted, size); size > math.MaxInt64-c.bytes {
		return evicted, fmt.Errorf("%w: %d bytes beside the %d held overflow the byte count", ErrTooLarge, size, c.bytes)
	}
	return evicted, nil
}

func (c *Cache[K, V]) insertLocked(key K, value V, size int64) *entry[V] {
	e := c.newEntryLocked(key, value, size)
	c.lru.Add(key, e)
	return e
}

// newEntryLocked makes key's entry and counts its bytes, without putting
// it in the index.
func (c *Cache[K, V]) newEntryLocked(key K, value V, size int64) *entry[V] {
	e := &entry[V]{key: key, value: value, size: size, expires: c.s.clock.Now().Add(c.s.ttl)}
	if c.expiry != nil {
		if t, ok := c.expiry(key, value); ok {
			e.expires, e.fixed = t, true
		}
	}
	if c.checksum != nil {
		e.sum = c.checksum(value)
	}
	c.bytes += size
	return e
}

// pinLocked adds n pins of req on e.
func (c *Cache[K, V]) pinLocked(req string, e *entry[V], n int) {
	if e.pins == 0 && e.detached == 0 {
		c.pinned++
	}
	e.pins += n
	set := c.requests[req]
	if set == nil {
		if k := len(c.free); k > 0 {
			set, c.free = c.free[k-1], c.free[:k-1]
		} else {
			set = &pinSet[V]{}
		}
		c.requests[req] = set
	}
	for range n {
		set.entries = append(set.entries, e)
	}
}

// enforceLocked evicts unpinned entries, expired ones first and then the
// least recently used, until the cache is within its budgets with room
// bytes to spare, or nothing unpinned is left. Pinned entries met at the
// old end move to the front: they are in use, and the next scan need not
// pass them again.
func (c *Cache[K, V]) enforceLocked(evicted []eviction[K, V], room int64) []eviction[K, V] {
	for scanned, n := 0, c.lru.Len(); scanned < n && c.lru.Len() > c.pinned; scanned++ {
		k, e, _ := c.lru.GetOldest()
		if e.pins > 0 {
			c.lru.Get(k)
			continue
		}
		cause := CauseSize
		if c.expiredLocked(e) {
			cause = CauseTTL
		} else if c.bytes <= c.s.maxBytes-room && c.lru.Len() <= c.s.maxEntries {
			break
		}
		c.lru.RemoveOldest()
		c.bytes -= e.size
		evicted = append(evicted, eviction[K, V]{k, e.value, cause})
	}
	return evicted
}

// unlockAndReport counts evictions, unlocks, and then runs the callback.
func (c *Cache[K, V]) unlockAndReport(evicted []eviction[K, V]) {
	for _, ev := range evicted {
		c.stats.Evictions[ev.cause]++
	}
	c.mu.Unlock()
	if c.onEvict != nil {
		for _, ev := range evicted {
			c.onEvict(ev.key, ev.value, ev.cause)
		}
	}
}

func (c *Cache[K, V]) out(v V) V {
	if c.clone != nil {
		return c.clone(v)
	}
	return v
}
