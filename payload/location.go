package payload

import (
	"fmt"
	"strings"

	"github.com/embcache/embcache/cachekey"
)

// ObjectID names a stored value: the tenant and the content key. It is the
// only name a transport stores under, so every stored object is
// content-addressed.
type ObjectID struct {
	Tenant string
	Key    cachekey.Key
}

// String returns "<tenant>/<keyhex>", the object's name in every store.
func (o ObjectID) String() string { return o.Tenant + "/" + o.Key.String() }

// Validate checks the tenant; the key is valid by construction.
func (o ObjectID) Validate() error {
	if err := cachekey.ValidateTenant(o.Tenant); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidLocation, err)
	}
	return nil
}

// ParseObjectID parses "<tenant>/<keyhex>". Anything else, including a
// path with '..' or more separators, is ErrInvalidLocation.
func ParseObjectID(s string) (ObjectID, error) {
	tenant, hexKey, ok := strings.Cut(s, "/")
	if !ok {
		return ObjectID{}, fmt.Errorf("%w: object %q is not <tenant>/<key>", ErrInvalidLocation, s)
	}
	key, err := cachekey.Parse(hexKey)
	if err != nil {
		return ObjectID{}, fmt.Errorf("%w: object %q: %w", ErrInvalidLocation, s, err)
	}
	o := ObjectID{Tenant: tenant, Key: key}
	return o, o.Validate()
}

// Transport names, as they appear in a Location.
const (
	TransportShm      = "shm"
	TransportHTTP     = "http"
	TransportMooncake = "mooncake"
	TransportMemory   = "memory"
)

// Location says where a committed value lives and what it must be. It is
// stored in the JSON lease record, so it is small and serialisable.
type Location struct {
	Transport string   `json:"transport"`
	Node      string   `json:"node"`              // the node that wrote it
	Address   string   `json:"address,omitempty"` // transport-specific: a base URL, a directory
	Object    string   `json:"object"`            // ObjectID.String()
	Size      int64    `json:"size"`              // encoded size in bytes
	Checksum  Checksum `json:"checksum"`          // BLAKE3 of the encoding
}

// ObjectID parses the location's object name.
func (l Location) ObjectID() (ObjectID, error) { return ParseObjectID(l.Object) }

// Names reports whether the location is obj's own payload. A record or an
// event of one key naming another's location would serve, or delete,
// that key's bytes: readers and deleters check it.
func (l Location) Names(obj ObjectID) bool {
	o, err := l.ObjectID()
	return err == nil && o == obj
}

// Validate checks what every transport relies on: a known transport, a
// content-addressed object name, a size that holds at least a prelude.
func (l Location) Validate() error {
	switch l.Transport {
	case TransportShm, TransportHTTP, TransportMooncake, TransportMemory:
	default:
		return fmt.Errorf("%w: unknown transport %q", ErrInvalidLocation, l.Transport)
	}
	if _, err := l.ObjectID(); err != nil {
		return err
	}
	if l.Size < PreludeSize {
		return fmt.Errorf("%w: size %d is smaller than a header", ErrInvalidLocation, l.Size)
	}
	return nil
}
