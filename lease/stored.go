package lease

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
)

// StoredWildcard matches every change every shard's stream republishes
// (embcache.stored.<shard's bucket>.<key>): what an operator's view of
// the leases computing now subscribes to.
const StoredWildcard = storedPrefix + ">"

// StoredKeysWildcard matches the changes every shard's stream republishes
// of keys, a bucket key or a subject wildcard of keys ("acme.>"):
// embcache.stored.*.<keys>.
func StoredKeysWildcard(keys string) string { return storedPrefix + "*." + keys }

// StoredTenantWildcard matches the changes every shard's stream
// republishes of one tenant's keys (its values', ValueKey, and its
// tombstones', TombstoneKey): what a view of that tenant's leases
// subscribes to.
func StoredTenantWildcard(tenant string) string { return StoredKeysWildcard(tenant + ".>") }

// DecodeStored reads a message a shard's stream republished: the key it
// is about and the key's state as stored (a record that does not decode
// is a Change whose Err wraps ErrBadRecord). ok is false for a message
// that is not such a republish (another subject, no sequence, or one
// republished without its body).
func DecodeStored(m *nats.Msg) (key string, c Change, ok bool) {
	rest, found := strings.CutPrefix(m.Subject, storedPrefix)
	if !found || m.Header.Get("Nats-Msg-Size") != "" {
		return "", Change{}, false
	}
	if _, key, found = strings.Cut(rest, "."); !found || key == "" {
		return "", Change{}, false
	}
	e, err := entryOf(m, key, "republished "+key)
	if err != nil && !errors.Is(err, ErrBadRecord) {
		return "", Change{}, false
	}
	return key, Change{Entry: e, Err: err}, true
}
