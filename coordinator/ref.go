package coordinator

import (
	"fmt"
	"unicode/utf8"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/lease"
	"github.com/embcache/embcache/payload"
)

// Ref names a cached value: its tenant and key, and the model and weight
// epoch that produced it (kept in the record, so a weight update can
// invalidate exactly what the old weights computed). Model and Epoch are
// the labels of the key's config (model_id, weight_epoch), which the key
// hashes: NewRef takes them from there. A record is served only to a Ref
// with its labels (the label rule, docs/protocol.md 4.4).
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

// Validate reports whether r can name a cached value: a tenant as a
// config's, and a model as a config's model_id (set, at most
// cachekey.MaxStringLen bytes of UTF-8). Every value belongs to a model
// so that Invalidate can find it: a record without one would outlive
// every invalidation. The error wraps cachekey.ErrInvalidConfig and names
// the field; every call that takes a Ref returns it before doing anything.
func (r Ref) Validate() error {
	if err := cachekey.ValidateTenant(r.Tenant); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	switch {
	case r.Model == "":
		return fmt.Errorf("coordinator: %w: model: required (the key's model_id): every value belongs to a model, so that an invalidation can find it",
			cachekey.ErrInvalidConfig)
	case len(r.Model) > cachekey.MaxStringLen:
		return fmt.Errorf("coordinator: %w: model: longer than %d bytes", cachekey.ErrInvalidConfig, cachekey.MaxStringLen)
	case !utf8.ValidString(r.Model):
		// The record's JSON could not carry it: it would come back as
		// another model, whose labels no Ref carries.
		return fmt.Errorf("coordinator: %w: model: not valid UTF-8", cachekey.ErrInvalidConfig)
	}
	return nil
}

// carries reports whether rec, a record of r's key, carries r's labels:
// only then is its value r's (the label rule, docs/protocol.md 4.4).
func (r Ref) carries(rec lease.Record) bool { return rec.Model == r.Model && rec.Epoch == r.Epoch }

// local is r's key in this process's cache.
func (r Ref) local() localKey { return localKey{obj: r.Object(), model: r.Model, epoch: r.Epoch} }

// localKey is a value's key in this process's cache, its flights and
// what the event link notes of it: its object and the labels it was
// computed or pulled under. A copy, or a flight, is shared only by
// requests of the same labels: a request of other labels has its own,
// so no copy reaches a caller whose labels it does not carry, and an
// invalidation of one model and epoch finds exactly their copies.
type localKey struct {
	obj   payload.ObjectID
	model string
	epoch uint64
}

// ref is the Ref k was made for.
func (k localKey) ref() Ref {
	return Ref{Tenant: k.obj.Tenant, Key: k.obj.Key, Model: k.model, Epoch: k.epoch}
}
