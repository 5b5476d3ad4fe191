package httppull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"unsafe"

	"github.com/embcache/embcache/payload"
	"github.com/zeebo/blake3"
)

var (
	// ErrUnauthorized is returned when a server refuses the transport's token.
	ErrUnauthorized = errors.New("httppull: unauthorized")
	// ErrBadAdvertise is returned by NewTransport for an advertise address
	// that is not an http(s)://host:port base URL.
	ErrBadAdvertise = errors.New("httppull: bad advertise address")
	// ErrBadPeer is returned by NewTransport and NewReader for a peer
	// (WithPeers) that is neither host:port nor an http(s) base URL.
	ErrBadPeer = errors.New("httppull: bad peer address")
)

// Store is where a Transport keeps what this node serves: Put stores
// locally, and the server serves it from there.
type Store interface {
	Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error)
	Generation(ctx context.Context, loc payload.Location) (payload.Generation, error)
	Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error
}

// Transport pulls values from other nodes' servers, and puts values into a
// local store that this node's Server serves at its advertised address.
type Transport struct {
	local     Store
	advertise string // base URL of this node's server, e.g. "http://10.0.0.5:7401"
	node      string
	client    *http.Client
	token     string
	peers     peers // the pull servers it trusts (WithPeers); nil: none named
	maxSize   int64
}

// Option configures a Transport. A bad one is payload.ErrInvalidOption.
type Option func(*Transport) error

// WithHTTPClient sets the client (for TLS: one whose transport trusts the
// servers' CA). The default is a client with no overall timeout: pulls are
// bounded by their context.
func WithHTTPClient(c *http.Client) Option {
	return func(t *Transport) error {
		if c == nil {
			return fmt.Errorf("%w: httppull: nil client", payload.ErrInvalidOption)
		}
		t.client = c
		return nil
	}
}

// WithToken sends "Authorization: Bearer <token>" with every pull, to
// trusted servers only: its peers (WithPeers) and its own advertised
// address. A pull from any other address is refused, and no request made.
func WithToken(token string) Option { return func(t *Transport) error { t.token = token; return nil } }

// WithMaxSize refuses to pull a value larger than n bytes (payload.ErrTooLarge).
func WithMaxSize(n int64) Option {
	return func(t *Transport) error {
		if n <= 0 {
			return fmt.Errorf("%w: httppull: max size must be > 0, got %d", payload.ErrInvalidOption, n)
		}
		t.maxSize = n
		return nil
	}
}

// DefaultMaxSize bounds a pulled value unless WithMaxSize says otherwise.
const DefaultMaxSize = 4 << 30

// NewTransport returns a transport for node that stores into local and
// advertises advertise (an http:// or https:// base URL) in its Locations.
func NewTransport(node, advertise string, local Store, opts ...Option) (*Transport, error) {
	u, err := url.Parse(advertise)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%w: %q is not an http(s)://host:port base URL", ErrBadAdvertise, advertise)
	}
	if local == nil {
		return nil, errors.New("httppull: nil local store")
	}
	t := &Transport{local: local, advertise: u.Scheme + "://" + u.Host, node: node,
		client: &http.Client{}, maxSize: DefaultMaxSize}
	for _, opt := range opts {
		if err := opt(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Put stores v locally and returns a Location other nodes pull it from.
func (t *Transport) Put(ctx context.Context, obj payload.ObjectID, v *payload.Value) (payload.Location, error) {
	loc, err := t.local.Put(ctx, obj, v)
	if err != nil {
		return payload.Location{}, err
	}
	loc.Transport, loc.Node, loc.Address = payload.TransportHTTP, t.node, t.advertise
	return loc, nil
}

// Generation returns the generation of the local copy.
func (t *Transport) Generation(ctx context.Context, loc payload.Location) (payload.Generation, error) {
	return t.local.Generation(ctx, loc)
}

// Delete removes the local copy if it is still in generation seen
// (payload.Transport).
func (t *Transport) Delete(ctx context.Context, loc payload.Location, seen payload.Generation) error {
	return t.local.Delete(ctx, loc, seen)
}

// Get pulls the value at loc from the server at loc.Address, streaming it
// into one 64-byte-aligned buffer while hashing, and verifies size and
// checksum before decoding. Errors: payload.ErrNotFound (404),
// ErrUnauthorized (401), payload.ErrCorrupt (size or checksum differ),
// payload.ErrTooLarge, payload.ErrUnavailable (the server cannot be reached
// or fails), payload.ErrUntrusted (loc.Address is not a trusted peer:
// WithPeers; nothing is sent there).
func (t *Transport) Get(ctx context.Context, loc payload.Location) (*payload.Value, error) {
	body, err := t.Stream(ctx, loc)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	buf, release := alignedBuffer(int(loc.Size))
	v, err := pull(ctx, body, buf, loc.Checksum)
	if err != nil {
		release()
		return nil, err
	}
	return payload.WithRelease(v, release), nil
}

// Stream requests the value at loc and returns the body as it arrives:
// loc.Size bytes, once the server's size and checksum headers agree with
// loc, but not verified yet. The caller must hash them against
// loc.Checksum before it uses them (shm.Store.Receive does, as it writes
// them), and close the body. Errors as Get's.
func (t *Transport) Stream(ctx context.Context, loc payload.Location) (io.ReadCloser, error) {
	if err := loc.Validate(); err != nil {
		return nil, err
	}
	if loc.Transport != payload.TransportHTTP {
		return nil, fmt.Errorf("%w: transport %q is not http", payload.ErrInvalidLocation, loc.Transport)
	}
	if loc.Size > t.maxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", payload.ErrTooLarge, loc.Size, t.maxSize)
	}
	base, err := url.Parse(loc.Address)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("%w: address %q", payload.ErrInvalidLocation, loc.Address)
	}
	if err := t.trust(base); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.Scheme+"://"+base.Host+PathPrefix+loc.Object, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", payload.ErrInvalidLocation, err)
	}
	if t.token != "" {
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s: %w", payload.ErrUnavailable, loc.Address, err)
	}
	if err := checkResponse(resp, loc); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp.Body, nil
}

// checkResponse checks a pull's status and that its size and checksum
// headers are loc's.
func checkResponse(resp *http.Response, loc payload.Location) error {
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("%w: %s on %s", payload.ErrNotFound, loc.Object, loc.Address)
	case http.StatusUnauthorized:
		return fmt.Errorf("%w by %s", ErrUnauthorized, loc.Address)
	default:
		return fmt.Errorf("%w: %s answered %s", payload.ErrUnavailable, loc.Address, resp.Status)
	}
	if resp.ContentLength != loc.Size || resp.Header.Get(HeaderSize) != strconv.FormatInt(loc.Size, 10) {
		return fmt.Errorf("%w: server sends %d bytes, location says %d", payload.ErrCorrupt, resp.ContentLength, loc.Size)
	}
	if resp.Header.Get(HeaderChecksum) != loc.Checksum.String() {
		return fmt.Errorf("%w: server's checksum %q, location says %v", payload.ErrCorrupt, resp.Header.Get(HeaderChecksum), loc.Checksum)
	}
	return nil
}

// pull reads the body into buf, hashing as it goes, and decodes it if the
// hash is sum.
func pull(ctx context.Context, body io.Reader, buf []byte, want payload.Checksum) (*payload.Value, error) {
	hasher := blake3.New()
	const chunk = 1 << 20
	for off := 0; off < len(buf); {
		end := min(off+chunk, len(buf))
		n, err := io.ReadFull(body, buf[off:end])
		hasher.Write(buf[off : off+n])
		off += n
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: body ended after %d of %d bytes: %w", payload.ErrCorrupt, off, len(buf), err)
		}
	}
	var sum payload.Checksum
	hasher.Sum(sum[:0])
	if sum != want {
		return nil, fmt.Errorf("%w: pulled bytes hash to %v, location says %v", payload.ErrCorrupt, sum, want)
	}
	return payload.Decode(buf)
}

// bufferPools recycle pull buffers by power-of-two size class: a fresh
// 100 MB buffer costs more in page faults than the hash of its contents.
var bufferPools [64]sync.Pool

// alignedBuffer returns n bytes starting at a 64-byte boundary, so the
// tensor data inside (64-aligned in the encoding) is aligned in memory,
// and the function that gives the buffer back to its pool.
func alignedBuffer(n int) ([]byte, func() error) {
	class := bits.Len(uint(n + payload.DataAlign - 1))
	raw, _ := bufferPools[class].Get().([]byte)
	if raw == nil {
		raw = make([]byte, 1<<class)
	}
	off := 0
	if rem := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % payload.DataAlign); rem != 0 {
		off = payload.DataAlign - rem
	}
	return raw[off : off+n : off+n], func() error { bufferPools[class].Put(raw); return nil }
}

var _ payload.Transport = (*Transport)(nil)
