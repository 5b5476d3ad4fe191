package agent

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// ErrMismatch is returned for an answer that names another call, key,
// reservation, client or request than the one asked: it is never taken as
// a value. net/http never lets two calls share a connection, so a Go
// client should not see it; the check is what would catch an agent that
// answers the wrong question.
var ErrMismatch = errors.New("agent: the answer is not to this call")

// Client calls an agent over its Unix socket. Its pins, reservations and
// slots live as long as its connections: Close (or the process's exit)
// gives them back.
type Client struct {
	ID    string // the client name pins are kept under
	http  *http.Client
	tr    *http.Transport
	calls atomic.Uint64 // names each call (CallHeader) with ID
}

// Dial returns a client of the agent at socket. It does not connect yet.
// Each connection it makes checks who listens on the socket first: calls
// to a process that runs as a user it does not trust fail with an error
// wrapping ErrUntrustedAgent (see WithAgentUID).
func Dial(socket string, opts ...DialOption) *Client {
	var cfg dialConfig
	for _, o := range opts {
		o(&cfg)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, err
			}
			if err := cfg.checkPeer(socket, conn); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		},
		MaxIdleConnsPerHost: 64,
	}
	return &Client{ID: fmt.Sprintf("go-%d-%s", os.Getpid(), randomID()[:8]), http: &http.Client{Transport: tr}, tr: tr}
}

// Close closes the client's connections: the agent releases what they held.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// APIError is an answer other than 2xx.
type APIError struct {
	Status  int
	Code    string // bad_request, not_found, conflict, unavailable, internal
	Message string
}

// Error returns the agent's code and message.
func (e *APIError) Error() string {
	return fmt.Sprintf("agent: %d %s: %s", e.Status, e.Code, e.Message)
}

func (c *Client) call(ctx context.Context, path string, in, out any) error {
	method, body := http.MethodGet, []byte(nil)
	if in != nil {
		method = http.MethodPost
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	return c.do(ctx, method, path, "application/json", nil, bytes.NewReader(body), out)
}

func (c *Client) do(ctx context.Context, method, path, contentType string, header http.Header, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, body)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set(ClientHeader, c.ID)
	call := c.ID + "." + strconv.FormatUint(c.calls.Add(1), 10)
	req.Header.Set(CallHeader, call)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if got := resp.Header.Get(CallHeader); got != call { // an error answer to another call is no answer either
		return fmt.Errorf("%w: %s %s answered as call %q", ErrMismatch, path, call, got)
	}
	if resp.StatusCode/100 != 2 {
		var body Error
		json.NewDecoder(resp.Body).Decode(&body)
		return &APIError{Status: resp.StatusCode, Code: body.Code, Message: body.Error}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Key returns the key of an input.
func (c *Client) Key(ctx context.Context, req KeyRequest) (KeyResponse, error) {
	var resp KeyResponse
	return resp, c.call(ctx, "/v1/key", req, &resp)
}

// Lookup returns a hit or a reservation; it waits while another process
// computes the key.
func (c *Client) Lookup(ctx context.Context, ref KeyRef, requestID string) (LookupResponse, error) {
	var resp LookupResponse
	if err := c.call(ctx, "/v1/lookup", LookupRequest{KeyRef: ref, Client: c.ID, RequestID: requestID}, &resp); err != nil {
		return LookupResponse{}, err
	}
	if resp.KeyRef != ref {
		return LookupResponse{}, fmt.Errorf("%w: looked up %s/%s, answered for %s/%s", ErrMismatch, ref.Tenant, ref.Key, resp.Tenant, resp.Key)
	}
	return resp, resp.checkRequest(c.ID, requestID)
}

// KeyBytes returns the key of data under config (a JSON object) in mode
// raw-bytes, or decoded-tensor with dtype and shape ([]int64{} for a
// scalar): the bytes are sent as they are and hashed as they arrive (POST
// /v1/key/bytes).
func (c *Client) KeyBytes(ctx context.Context, config json.RawMessage, mode, dtype string, shape []int64, data io.Reader) (KeyResponse, error) {
	q := url.Values{"mode": {mode}}
	if mode == "decoded-tensor" {
		dims := make([]string, len(shape))
		for i, d := range shape {
			dims[i] = strconv.FormatInt(d, 10)
		}
		q.Set("dtype", dtype)
		if shape != nil { // nil is no shape, which the agent refuses; []int64{} is a scalar's
			q.Set("shape", strings.Join(dims, ","))
		}
	}
	// A header holds no newline: a config file as written (indented JSON)
	// is sent compacted, as the same object.
	// (A config that is no JSON is sent as it is, for the agent to refuse.)
	header := string(config)
	var compact bytes.Buffer
	if json.Compact(&compact, config) == nil {
		header = compact.String()
	}
	var resp KeyResponse
	return resp, c.do(ctx, http.MethodPost, "/v1/key/bytes?"+q.Encode(), "application/octet-stream",
		http.Header{ConfigHeader: {header}}, data, &resp)
}

// Get returns a hit, or a miss (Status StatusMiss): it never reserves the
// key nor waits for a compute.
func (c *Client) Get(ctx context.Context, ref KeyRef, requestID string) (LookupResponse, error) {
	var resp LookupResponse
	if err := c.call(ctx, "/v1/get", LookupRequest{KeyRef: ref, Client: c.ID, RequestID: requestID}, &resp); err != nil {
		return LookupResponse{}, err
	}
	if resp.KeyRef != ref {
		return LookupResponse{}, fmt.Errorf("%w: got %s/%s, answered for %s/%s", ErrMismatch, ref.Tenant, ref.Key, resp.Tenant, resp.Key)
	}
	return resp, resp.checkRequest(c.ID, requestID)
}

// Commit hands the agent the computed tensor bytes of a reservation. The
// answer (Status StatusAccepted) comes once the agent has the value; it
// shares it with the cluster after answering.
func (c *Client) Commit(ctx context.Context, reservation, requestID, dtype string, shape []int64, data []byte) (LookupResponse, error) {
	var resp LookupResponse
	if err := c.call(ctx, "/v1/commit", CommitRequest{Reservation: reservation, Client: c.ID, RequestID: requestID,
		DType: dtype, Shape: shape, Data: data}, &resp); err != nil {
		return LookupResponse{}, err
	}
	if resp.Reservation != reservation {
		return LookupResponse{}, fmt.Errorf("%w: committed reservation %s, answered for %q", ErrMismatch, reservation, resp.Reservation)
	}
	return resp, resp.checkRequest(c.ID, requestID)
}

// checkRequest checks that an answer names the client and request it was
// asked for.
func (r *LookupResponse) checkRequest(client, requestID string) error {
	if r.Client != client || r.RequestID != requestID {
		return fmt.Errorf("%w: asked for request %q of client %q, answered for request %q of client %q",
			ErrMismatch, requestID, client, r.RequestID, r.Client)
	}
	return nil
}

// Abandon gives a reservation up.
func (c *Client) Abandon(ctx context.Context, reservation, reason string) error {
	return c.call(ctx, "/v1/abandon", AbandonRequest{Reservation: reservation, Reason: reason}, nil)
}

// Release unpins what requestID looked up.
func (c *Client) Release(ctx context.Context, requestID string) (int, error) {
	var resp ReleaseResponse
	if err := c.call(ctx, "/v1/release", ReleaseRequest{Client: c.ID, RequestID: requestID}, &resp); err != nil {
		return 0, err
	}
	if resp.Client != c.ID || resp.RequestID != requestID {
		return 0, fmt.Errorf("%w: released request %q of client %q, answered for request %q of client %q",
			ErrMismatch, requestID, c.ID, resp.RequestID, resp.Client)
	}
	return resp.Released, nil
}

// Stats returns the agent's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	return s, c.call(ctx, "/v1/stats", nil, &s)
}

// ErrReplaced is returned by Map when the hit's file no longer holds the
// value the agent answered with: the file was replaced since (another
// value of the key placed at its name). Ask again.
var ErrReplaced = errors.New("agent: the hit's file no longer holds the value the agent answered")

// Map maps a hit's file read-only and returns its tensor data and a
// function that unmaps it. No byte is copied. The file's trailer (the
// checksum of its encoding, docs/protocol.md 2.3, which the agent
// verified) must be the hit's checksum, or the error wraps ErrReplaced:
// a file replaced since the answer is not this value.
func Map(h *Hit) ([]byte, func() error, error) {
	f, err := os.Open(h.File)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if h.Offset < 0 || h.Length < 0 || h.Offset+h.Length > fi.Size() {
		return nil, nil, fmt.Errorf("agent: hit [%d, +%d) outside %s (%d bytes)", h.Offset, h.Length, h.File, fi.Size())
	}
	const trailer = 32
	if fi.Size() < h.Offset+h.Length+trailer {
		return nil, nil, fmt.Errorf("%w: %s (%d bytes) has no trailer after the hit", ErrReplaced, h.File, fi.Size())
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	if hex.EncodeToString(m[len(m)-trailer:]) != h.Checksum {
		syscall.Munmap(m)
		return nil, nil, fmt.Errorf("%w: %s, checksum %s", ErrReplaced, h.File, h.Checksum)
	}
	return m[h.Offset : h.Offset+h.Length], func() error { return syscall.Munmap(m) }, nil
}
