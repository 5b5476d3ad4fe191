package events

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/zeebo/blake3"
)

// Notices tell one node's processes that a value their node wrote left
// the store: the evicted event, sent as a core NATS message to the
// writer's node alone (docs/protocol.md 4), so that a worker hears of the
// evictions that concern it rather than of every eviction in the cluster.
// A notice is not stored: a process that misses one (disconnected, not
// started yet) keeps its copy until the copy's own expiry, which is its
// record's, and its node's payload sweep removes the file.

// NoticePrefix is the root of every notice subject.
const NoticePrefix = "embcache.node."

// NodeToken names a node in subjects: the first 16 bytes of
// BLAKE3("embcache/node/v1" 0x00 node) as 32 hex digits, so any node name
// (a host name with dots) is one subject token.
func NodeToken(node string) string {
	sum := blake3.Sum256([]byte("embcache/node/v1\x00" + node))
	return hex.EncodeToString(sum[:16])
}

// NoticeSubject is where evictions of tenant's values written by node are
// announced: embcache.node.<tenant>.<NodeToken(node)>.
func NoticeSubject(tenant, node string) string {
	return NoticePrefix + tenant + "." + NodeToken(node)
}

// Notify sends e, an evicted event with the payload's location, to the
// processes of the node that wrote it. It does not wait for anyone.
func Notify(nc *nats.Conn, e *Event) error {
	if e.Kind != KindEvicted || e.Location == nil || e.Location.Node == "" {
		return fmt.Errorf("%w: a notice is an evicted event with the payload's location", ErrBadEvent)
	}
	body, err := Encode(e)
	if err != nil {
		return err
	}
	return nc.Publish(NoticeSubject(e.Tenant, e.Location.Node), body)
}

// NoticeSubscription delivers a node's notices until Stop.
type NoticeSubscription struct {
	subs []*nats.Subscription

	mu      sync.RWMutex // held shared by each handle call, so Stop can wait for them
	stopped bool         // guarded by mu
}

// SubscribeNotices calls handle with every notice for node: of every
// tenant, or of tenants only (which needs only their permissions). A
// notice that does not decode, is not an evicted event, or names another
// tenant or node than its subject is passed to onBad (if set) and
// skipped. handle runs on one goroutine per tenant subscribed.
func SubscribeNotices(nc *nats.Conn, node string, tenants []string, handle func(Event), onBad func(BadReason)) (*NoticeSubscription, error) {
	if len(tenants) == 0 {
		tenants = []string{"*"}
	}
	token := NodeToken(node)
	ns := &NoticeSubscription{}
	for _, t := range tenants {
		sub, err := nc.Subscribe(NoticePrefix+t+"."+token, func(m *nats.Msg) {
			e, err := decodeNotice(m.Subject, m.Data, node)
			if err != nil {
				if onBad != nil {
					onBad(ReasonOf(err))
				}
				return
			}
			ns.mu.RLock()
			defer ns.mu.RUnlock()
			if !ns.stopped {
				handle(e)
			}
		})
		if err != nil {
			ns.Stop()
			return nil, err
		}
		ns.subs = append(ns.subs, sub)
	}
	return ns, nil
}

func decodeNotice(subject string, body []byte, node string) (Event, error) {
	e, err := Decode(body)
	if err != nil {
		return e, err
	}
	tenant, _, _ := strings.Cut(strings.TrimPrefix(subject, NoticePrefix), ".")
	if e.Kind != KindEvicted || e.Tenant != tenant || e.Location == nil || e.Location.Node != node {
		return e, &DecodeError{Reason: BadInvalid, Err: fmt.Errorf("%w: notice on %s is %s of tenant %q", ErrBadEvent, subject, e.Kind, e.Tenant)}
	}
	return e, nil
}

// Stop ends the subscriptions and waits until handle is no longer called.
func (ns *NoticeSubscription) Stop() {
	for _, s := range ns.subs {
		s.Unsubscribe()
	}
	ns.mu.Lock()
	ns.stopped = true
	ns.mu.Unlock()
}
