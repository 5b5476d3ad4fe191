package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embcache/embcache/embedded"
	"github.com/nats-io/nats.go"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "embcache-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestServeTLSAndPassword: serve with TLS and a user; a client with the CA
// and the password connects, one without TLS or with a wrong password
// does not.
func TestServeTLSAndPassword(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	port, _ := embedded.FreePort("127.0.0.1")
	serve := exec.Command(binary, "serve", "--port", fmt.Sprint(port), "--store-dir", filepath.Join(dir, "js"),
		"--shm-dir", filepath.Join(dir, "shm"), "--tls-cert", certFile, "--tls-key", keyFile,
		"--user", "worker", "--password", "s3cret", "--no-reconciler")
	out := &syncBuffer{}
	serve.Stdout, serve.Stderr = out, out
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		serve.Process.Signal(os.Interrupt)
		serve.Wait()
		if !strings.Contains(out.String(), "stopped") || strings.Contains(out.String(), "not ready") {
			t.Errorf("serve did not run cleanly over its own TLS connection:\n%s", out.String())
		}
	}()
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	tlsConf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	var nc *nats.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		nc, err = nats.Connect(url, nats.Secure(tlsConf), nats.UserInfo("worker", "s3cret"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS client with the password: %v\n%s", err, out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a process's startup
	}
	nc.Close()
	if nc, err := nats.Connect(url, nats.Secure(tlsConf), nats.UserInfo("worker", "wrong")); err == nil {
		nc.Close()
		t.Fatal("a wrong password was accepted")
	}
	if nc, err := nats.Connect(url, nats.Secure(tlsConf)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was accepted")
	}
	if nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), nats.UserInfo("worker", "s3cret"),
		nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client without TLS was accepted")
	}
	if _, stderr, code := run(t, "stats", "--nats", fmt.Sprintf("nats://127.0.0.1:%d", port), "--timeout", "1s"); code != 1 {
		t.Fatalf("stats without credentials: exit %d: %s", code, stderr)
	}
}
