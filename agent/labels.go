package agent

import (
	"fmt"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/coordinator"
)

// keyLabels are the labels a key was made under: the tenant, model_id and
// weight_epoch of the config the agent keyed it with.
type keyLabels struct {
	tenant, model string
	epoch         uint64
}

// keyLabelsKept is how many keys' labels the agent remembers (the last
// keyed): tens of bytes each. A key it no longer remembers is looked up
// under the labels its request names, which must still name a model.
const keyLabelsKept = 1 << 16

// keyed remembers that keys were made under cfg: a lookup or get of one
// of them takes its labels from cfg (refOf).
func (s *Server) keyed(cfg cachekey.PreprocessingConfig, keys ...cachekey.Key) {
	l := keyLabels{tenant: cfg.Tenant, model: cfg.ModelID, epoch: cfg.WeightEpoch}
	for _, k := range keys {
		s.labels.Add(k, l)
	}
}

// refOf reads a request's key reference; a malformed key or tenant is the
// caller's error (a tenant was refused only by the coordinator, as an
// internal error the Python client took for an outage). Invalidation
// follows a record's labels (docs/protocol.md 4.4), so they must be the
// key's own: for a key this agent made, the labels are those of the
// config it keyed, and a request that names others (another tenant,
// model or weight_epoch, or none) is refused, naming the field. Any
// request must name a model (coordinator.Ref.Validate).
func (s *Server) refOf(k KeyRef) (coordinator.Ref, error) {
	key, err := cachekey.Parse(k.Key)
	if err != nil {
		return coordinator.Ref{}, err
	}
	if err := cachekey.ValidateTenant(k.Tenant); err != nil {
		return coordinator.Ref{}, err
	}
	if l, ok := s.labels.Get(key); ok {
		if err := l.contradicts(k); err != nil {
			return coordinator.Ref{}, err
		}
		return coordinator.Ref{Tenant: l.tenant, Key: key, Model: l.model, Epoch: l.epoch}, nil
	}
	ref := coordinator.Ref{Tenant: k.Tenant, Key: key, Model: k.Model, Epoch: k.WeightEpoch}
	if err := ref.Validate(); err != nil {
		return coordinator.Ref{}, err
	}
	return ref, nil
}

// contradicts says which of k's labels differ from l, the labels of the
// config k's key was made under; nil if none does.
func (l keyLabels) contradicts(k KeyRef) error {
	made := "the key was made under a config of"
	switch {
	case k.Tenant != l.tenant:
		return fmt.Errorf("tenant: %s tenant %q, the request names %q", made, l.tenant, k.Tenant)
	case k.Model == "":
		return fmt.Errorf("model: missing; %s model_id %q (every value belongs to a model, so that an invalidation can find it)", made, l.model)
	case k.Model != l.model:
		return fmt.Errorf("model: %s model_id %q, the request names %q", made, l.model, k.Model)
	case k.WeightEpoch != l.epoch:
		return fmt.Errorf("weight_epoch: %s weight_epoch %d, the request names %d", made, l.epoch, k.WeightEpoch)
	}
	return nil
}
