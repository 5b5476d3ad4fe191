package embedded

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrInvalidConfig is returned by Start for a ConfigFile or TLS files it
// cannot use.
var ErrInvalidConfig = errors.New("embedded: invalid configuration")

// applyFiles applies ConfigFile and the TLS files to o.
func (s *Server) applyFiles(o *server.Options) error {
	if f := s.opts.ConfigFile; f != "" {
		fromFile, err := server.ProcessConfigFile(f)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f, err)
		}
		// The file brings accounts, users and permissions; Options keep the rest.
		o.Accounts, o.Users, o.Nkeys, o.SystemAccount = fromFile.Accounts, fromFile.Users, fromFile.Nkeys, fromFile.SystemAccount
		o.NoAuthUser = fromFile.NoAuthUser
		if fromFile.TLSConfig != nil {
			o.TLSConfig = fromFile.TLSConfig
		}
	}
	if s.opts.TLSCert == "" && s.opts.TLSKey == "" {
		return nil
	}
	ca := s.opts.TLSCA
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: s.opts.TLSCert, KeyFile: s.opts.TLSKey, CaFile: ca, Verify: ca != ""})
	if err != nil {
		return fmt.Errorf("%w: TLS: %w", ErrInvalidConfig, err)
	}
	o.TLSConfig, o.TLS, o.TLSVerify = tc, true, ca != ""
	return nil
}

// ClientTLS is the TLS configuration a client in this process connects
// with: it trusts TLSCA and presents TLSCert (mutual TLS), or without a CA
// trusts the server's own (self-signed) TLSCert. Nil without TLS.
func (s *Server) ClientTLS() (*tls.Config, error) {
	if s.opts.TLSCert == "" {
		return nil, nil
	}
	trusted := s.opts.TLSCA
	if trusted == "" {
		trusted = s.opts.TLSCert
	}
	pem, err := os.ReadFile(trusted)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no certificate", ErrInvalidConfig, trusted)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if s.opts.TLSCA != "" {
		cert, err := tls.LoadX509KeyPair(s.opts.TLSCert, s.opts.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
