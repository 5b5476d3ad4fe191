package embedded

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// selfSigned writes a CA certificate for 127.0.0.1, good for a server and
// a client, and its key.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "embedded-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}

func TestTLS(t *testing.T) {
	cert, key := selfSigned(t)
	for _, ca := range []string{"", cert} { // server TLS; mutual TLS
		s, err := Start(Options{StoreDir: t.TempDir(), TLSCert: cert, TLSKey: key, TLSCA: ca})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(s.ClientURL(), "tls://") {
			t.Errorf("client URL %s", s.ClientURL())
		}
		nc, err := s.Connect()
		if err != nil {
			t.Fatalf("CA %q: %v", ca, err)
		}
		nc.Close()
		if nc, err := nats.Connect(strings.Replace(s.ClientURL(), "tls://", "nats://", 1), nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Errorf("CA %q: a client without TLS connected", ca)
		}
		s.Shutdown()
	}
}

func TestConfigFile(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	os.WriteFile(conf, []byte("authorization { users = [ {user: app, password: secret} ] }\n"), 0o600)
	s, err := Start(Options{StoreDir: t.TempDir(), ConfigFile: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("connected without the file's credentials")
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestInvalidConfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, o := range []Options{{ConfigFile: missing}, {TLSCert: missing, TLSKey: missing}} {
		o.StoreDir = t.TempDir()
		if s, err := Start(o); !errors.Is(err, ErrInvalidConfig) {
			if err == nil {
				s.Shutdown()
			}
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestNotReadySaysWhy: a server that stops as it starts says why, with
// its log off: here accounts whose JetStream memory exceeds the server's.
func TestNotReadySaysWhy(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	os.WriteFile(conf, []byte("accounts { A { jetstream { max_mem: 1GiB }, users = [ {user: a, password: a} ] } }\n"), 0o600)
	s, err := Start(Options{StoreDir: t.TempDir(), ConfigFile: conf, ReadyTimeout: time.Second})
	if err == nil {
		s.Shutdown()
		t.Fatal("an account with more JetStream memory than the server has started")
	}
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "insufficient memory resources") {
		t.Fatalf("%v", err)
	}
}
