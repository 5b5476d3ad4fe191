package coordinator

import (
	"fmt"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// Ref names a cached value: its tenant and key, and the model and weight
// epoch that produced it (kept in the record, so a weight update can
// invalidate exactly what the old weights computed).
type Ref struct {
	Tenant string
	Key    cachekey.Key
	Model  string
	Epoch  uint64
}

// NewRef returns the Ref of key under cfg.
func NewRef(cfg cachekey.PreprocessingConfig, key cachekey.Key) Ref {
	return Ref{Tenant: cfg.Tenant, Key: key, Model: cfg.ModelID, Epoch: cfg.WeightEpoch}
}

// Object is the payload object the value is stored as.
func (r Ref) Object() payload.ObjectID { return payload.ObjectID{Tenant: r.Tenant, Key: r.Key} }

// KVKey is the key's name in the bucket: "<tenant>.<keyhex>".
func (r Ref) KVKey() string { return lease.ValueKey(r.Tenant, r.Key) }

// String returns "<tenant>/<keyhex>".
func (r Ref) String() string { return r.Object().String() }

func (r Ref) validate() error {
	if err := cachekey.ValidateTenant(r.Tenant); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	return nil
}
