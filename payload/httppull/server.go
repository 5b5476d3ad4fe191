package httppull

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/embcache/embcache/payload"
)

// PathPrefix is where payloads are served.
const PathPrefix = "/v1/payload/"

// Response headers.
const (
	HeaderChecksum = "X-Embcache-Checksum"
	HeaderSize     = "X-Embcache-Size"
)

// Source is where a server finds the encodings it serves; the shm store
// and payload.MemoryStore are sources.
type Source interface {
	Open(ctx context.Context, obj payload.ObjectID) (*payload.Blob, error)
}

// Server serves the objects of a Source. It is an http.Handler.
type Server struct {
	src          Source
	token        string
	tenantTokens map[string]string // token -> the one tenant it may pull
	logger       *slog.Logger
	writeStall   time.Duration
}

// DefaultWriteStall is how long a body's write may wait for a client that
// does not read (WithWriteStall).
const DefaultWriteStall = 30 * time.Second

// writeChunk is how much of a body goes out under one write deadline.
const writeChunk = 4 << 20

// ServerOption configures a Server. A bad one is payload.ErrInvalidOption.
type ServerOption func(*Server) error

// WithServerToken requires "Authorization: Bearer <token>" on every request.
func WithServerToken(token string) ServerOption {
	return func(s *Server) error {
		if token == "" {
			return fmt.Errorf("%w: httppull: empty server token", payload.ErrInvalidOption)
		}
		s.token = token
		return nil
	}
}

// WithTenantToken adds a bearer token that may pull only tenant's objects:
// with it, any other object is 401 as if the token were wrong. It turns
// authentication on, like WithServerToken.
func WithTenantToken(tenant, token string) ServerOption {
	return func(s *Server) error {
		if tenant == "" || token == "" {
			return fmt.Errorf("%w: httppull: a tenant token needs a tenant and a token", payload.ErrInvalidOption)
		}
		if s.tenantTokens == nil {
			s.tenantTokens = map[string]string{}
		}
		s.tenantTokens[token] = tenant
		return nil
	}
}

// WithWriteStall bounds how long the body's write waits for a client that
// stops reading (default DefaultWriteStall): past it the connection is
// dropped, and with it the value's mapping the handler held (it held it
// until the client went away).
func WithWriteStall(d time.Duration) ServerOption {
	return func(s *Server) error {
		if d <= 0 {
			return fmt.Errorf("%w: httppull: write stall must be > 0, got %v", payload.ErrInvalidOption, d)
		}
		s.writeStall = d
		return nil
	}
}

// WithLogger sets where the server logs failures (default: slog.Default()).
func WithLogger(l *slog.Logger) ServerOption {
	return func(s *Server) error {
		if l == nil {
			return fmt.Errorf("%w: httppull: nil logger", payload.ErrInvalidOption)
		}
		s.logger = l
		return nil
	}
}

// NewServer returns a handler serving src. A bad option is
// payload.ErrInvalidOption.
func NewServer(src Source, opts ...ServerOption) (*Server, error) {
	s := &Server{src: src, logger: slog.Default(), writeStall: DefaultWriteStall}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if (s.token != "" || s.tenantTokens != nil) && !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="embcache"`)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// The escaped path, so %2e%2e or %2f cannot turn into something the
	// object parser would see differently from what was sent.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), PathPrefix)
	if !ok || r.URL.RawQuery != "" {
		http.Error(w, "not a payload path", http.StatusBadRequest)
		return
	}
	obj, err := payload.ParseObjectID(rest)
	if err != nil {
		http.Error(w, "malformed object name", http.StatusBadRequest)
		return
	}
	blob, err := s.src.Open(r.Context(), obj)
	if errors.Is(err, payload.ErrNotFound) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if err != nil {
		s.logger.Warn("httppull: open failed", "object", obj.String(), "err", err)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	defer blob.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.Itoa(len(blob.Data)))
	h.Set(HeaderSize, strconv.Itoa(len(blob.Data)))
	h.Set(HeaderChecksum, blob.Checksum.String())
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	defer rc.SetWriteDeadline(time.Time{}) // not the next request's on this connection
	for data := blob.Data; len(data) > 0; {
		n := min(len(data), writeChunk)
		rc.SetWriteDeadline(time.Now().Add(s.writeStall)) // an error: a writer without deadlines
		if _, err := w.Write(data[:n]); err != nil {
			s.logger.Debug("httppull: client went away or stopped reading", "object", obj.String(), "err", err)
			return
		}
		data = data[n:]
	}
}

func (s *Server) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	if s.token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1 {
		return true
	}
	for token, tenant := range s.tenantTokens {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			rest, _ := strings.CutPrefix(r.URL.EscapedPath(), PathPrefix)
			obj, err := payload.ParseObjectID(rest)
			return err == nil && obj.Tenant == tenant
		}
	}
	return false
}
