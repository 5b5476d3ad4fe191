package httppull

import (
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"

	"github.com/embcache/embcache/payload"
)

// peers is the set of pull servers a puller trusts, keyed by host:port
// (the host lowercased, the port explicit): the scheme a peer was named
// with ("" if named as host:port, which trusts either).
type peers map[string]string

// WithPeers names the pull servers this node trusts: it pulls only from
// them (and from its own advertised address), and sends its token only to
// them. An address is host:port (http or https) or an http(s)://host:port
// base URL (that scheme only). A Location naming any other address is
// refused with payload.ErrUntrusted before a request is made: the address
// is read from a record, which whoever can write the bucket can plant.
//
// Without WithPeers, a transport with a token (WithToken) trusts its own
// advertised address only, and one without a token pulls from any
// address (it has no secret to give away).
func WithPeers(addrs ...string) Option {
	return func(t *Transport) error {
		if t.peers == nil {
			t.peers = peers{}
		}
		for _, a := range addrs {
			key, scheme, err := peerKey(a)
			if err != nil {
				return err
			}
			t.peers[key] = scheme
		}
		return nil
	}
}

// peerKey parses a peer's address: host:port, or an http(s) base URL.
func peerKey(addr string) (key, scheme string, err error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return "", "", fmt.Errorf("%w: %q is not host:port or an http(s)://host:port base URL", ErrBadPeer, addr)
		}
		return hostKey(u), u.Scheme, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return "", "", fmt.Errorf("%w: %q is not host:port or an http(s)://host:port base URL", ErrBadPeer, addr)
	}
	return net.JoinHostPort(strings.ToLower(host), port), "", nil
}

// hostKey is u's host:port, the host lowercased and the scheme's default
// port written out.
func hostKey(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// trust checks that base, a Location's address, is one this transport
// pulls from (WithPeers): the error wraps payload.ErrUntrusted and says
// which addresses it trusts, and how to add one.
func (t *Transport) trust(base *url.URL) error {
	if t.peers == nil && t.token == "" {
		return nil // no peers named, no secret to give away: any address
	}
	key := hostKey(base)
	if scheme, ok := t.peers[key]; ok && (scheme == "" || scheme == base.Scheme) {
		return nil
	}
	if t.advertise != "" && t.advertise == base.Scheme+"://"+base.Host {
		return nil // this node's own pull server
	}
	var trusted []string
	for k, scheme := range t.peers {
		if scheme != "" {
			k = scheme + "://" + k
		}
		trusted = append(trusted, k)
	}
	if t.advertise != "" {
		trusted = append(trusted, t.advertise)
	}
	sort.Strings(trusted)
	why := "its peers are " + strings.Join(trusted, ", ")
	if len(trusted) == 0 {
		why = "it has no peers"
	}
	if t.peers == nil {
		why = "with a token and no peers named, it pulls only from its own address"
		if t.advertise == "" {
			why = "with a token and no peers named, it pulls from no address"
		}
	}
	return fmt.Errorf("%w: %s is not a pull peer of this node (%s): no request made, no token sent; "+
		"name the servers to trust with httppull.WithPeers (embcache --payload-peers host:port,...)",
		payload.ErrUntrusted, base.Scheme+"://"+base.Host, why)
}
