package events

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/embcache/embcache/cachekey"
	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

// ErrBadEvent is returned for a body that does not decode, has an unknown
// version or kind, or lacks what its kind needs.
var ErrBadEvent = errors.New("events: bad event")

// Kind is what happened.
type Kind uint8

// Event kinds.
const (
	KindPublished Kind = iota + 1
	KindTouched
	KindEvicted
	KindAbandoned
	KindInvalidated
)

var kindNames = [...]string{"", "published", "touched", "evicted", "abandoned", "invalidated"}

// String returns the kind as it appears in subjects.
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ParseKind is the inverse of String.
func ParseKind(s string) (Kind, error) {
	for i := 1; i < len(kindNames); i++ {
		if kindNames[i] == s {
			return Kind(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown kind %q (one of %s)", ErrBadEvent, s, strings.Join(kindNames[1:], ", "))
}

// Kinds lists every kind.
func Kinds() []Kind {
	return []Kind{KindPublished, KindTouched, KindEvicted, KindAbandoned, KindInvalidated}
}

// Cause says why a store copy was evicted.
type Cause uint8

// Eviction causes.
const (
	CauseExpired     Cause = iota + 1 // its store TTL ran out
	CauseInvalidated                  // its tenant, model and epoch were invalidated
	CauseCorrupt                      // its payload was missing or failed verification
	CauseExplicit                     // an operator removed it
)

// String returns "expired", "invalidated", "corrupt" or "explicit".
func (c Cause) String() string {
	switch c {
	case CauseExpired:
		return "expired"
	case CauseInvalidated:
		return "invalidated"
	case CauseCorrupt:
		return "corrupt"
	case CauseExplicit:
		return "explicit"
	}
	return fmt.Sprintf("Cause(%d)", uint8(c))
}

// Event is one event. Which fields are set depends on Kind: Location and
// Expires for published and touched; Cause for evicted; Model and Epoch
// for invalidated (and, when known, for the others). Its wire form is
// Encode's (docs/protocol.md section 4).
type Event struct {
	Kind     Kind
	Tenant   string
	Key      cachekey.Key
	Model    string
	Epoch    uint64
	Node     string // who emitted it
	Time     time.Time
	Expires  time.Time
	Location *payload.Location
	Cause    Cause
	Reason   string // abandoned: the compute's error
}

// Subject returns the event's subject: embcache.ev.<tenant>.<kind>.<keyhex>.
// An invalidated event's key is InvalidationKey(model, epoch).
func (e *Event) Subject() string {
	return SubjectPrefix + e.Tenant + "." + e.Kind.String() + "." + e.Key.String()
}

// SubjectPrefix is the root of every event subject.
const SubjectPrefix = "embcache.ev."

// InvalidationKey names an invalidation in subjects: BLAKE3 of the model
// and the epoch, so model names with '.' or '/' stay one subject token, and
// each (model, epoch) keeps its own last event.
func InvalidationKey(model string, epoch uint64) cachekey.Key {
	return cachekey.Key(blake3.Sum256(fmt.Appendf(nil, "embcache/invalidation/v1\x00%s\x00%d", model, epoch)))
}

// Validate checks what Kind requires.
func (e *Event) Validate() error {
	if e.Kind < KindPublished || e.Kind > KindInvalidated {
		return fmt.Errorf("%w: unknown kind %d", ErrBadEvent, e.Kind)
	}
	if err := cachekey.ValidateTenant(e.Tenant); err != nil {
		return fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	if e.Time.IsZero() {
		return fmt.Errorf("%w: %v without a time", ErrBadEvent, e.Kind)
	}
	switch e.Kind {
	case KindPublished, KindTouched:
		if e.Location == nil || e.Expires.IsZero() {
			return fmt.Errorf("%w: %v without location or expiry", ErrBadEvent, e.Kind)
		}
		if e.Expires.Sub(e.Time) > MaxStoreTTL {
			return fmt.Errorf("%w: %v expires %v after its time, more than the longest store TTL (%v)", ErrBadEvent, e.Kind,
				e.Expires.Sub(e.Time), MaxStoreTTL)
		}
		if err := e.Location.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrBadEvent, err)
		}
	case KindEvicted:
		if e.Cause < CauseExpired || e.Cause > CauseExplicit {
			return fmt.Errorf("%w: evicted with cause %d", ErrBadEvent, e.Cause)
		}
	case KindInvalidated:
		if e.Model == "" || e.Key != InvalidationKey(e.Model, e.Epoch) {
			return fmt.Errorf("%w: invalidated needs a model and its invalidation key", ErrBadEvent)
		}
	}
	// A value's event names the value's own payload: one naming another
	// key's would have that key's copies dropped and its file deleted.
	if e.Location != nil && !e.Location.Names(payload.ObjectID{Tenant: e.Tenant, Key: e.Key}) {
		return fmt.Errorf("%w: a %v event of %s/%s naming the payload %s", ErrBadEvent, e.Kind, e.Tenant, e.Key, e.Location.Object)
	}
	return nil
}

// ParseSubject splits an event subject into tenant, kind and key.
func ParseSubject(subject string) (tenant string, kind Kind, key cachekey.Key, err error) {
	parts := strings.Split(strings.TrimPrefix(subject, SubjectPrefix), ".")
	if !strings.HasPrefix(subject, SubjectPrefix) || len(parts) != 3 {
		return "", 0, key, fmt.Errorf("%w: subject %q", ErrBadEvent, subject)
	}
	if kind, err = ParseKind(parts[1]); err != nil {
		return "", 0, key, err
	}
	if key, err = cachekey.Parse(parts[2]); err != nil {
		return "", 0, key, fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	return parts[0], kind, key, nil
}

// Filter returns the subject filter for a tenant ("" for all) and kind (0
// for all).
func Filter(tenant string, kind Kind) string {
	t, k := "*", "*"
	if tenant != "" {
		t = tenant
	}
	if kind != 0 {
		k = kind.String()
	}
	return SubjectPrefix + t + "." + k + ".*"
}
