package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
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
	"github.com/embcache/embcache/internal/syncbuf"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
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
	out := &syncbuf.Buffer{}
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

// TestClientsTakeTLSAndCredentials: worker, stats and health reach a serve
// with TLS and a password with --nats-ca, --user and --password, and fail
// saying why without them; a worker in the default mode, which computes
// locally when NATS is away, logs why it cannot connect.
func TestClientsTakeTLSAndCredentials(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	port, _ := embedded.FreePort("127.0.0.1")
	serve := startProcess(t, "serve", "--port", fmt.Sprint(port), "--store-dir", filepath.Join(dir, "js"),
		"--shm-dir", filepath.Join(dir, "shm"), "--tls-cert", certFile, "--tls-key", keyFile,
		"--user", "worker", "--password", "s3cret", "--no-reconciler")
	waitOutput(t, serve, "embcache serve: ready", "")
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	creds := []string{"--nats", url, "--nats-ca", certFile, "--user", "worker", "--password", "s3cret"}

	worker := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"worker", "--role", "encoder", "--embed-mb", "0.01", "--encode-ms", "1",
			"--shm-dir", filepath.Join(dir, "shm")}, args...)...)
		cmd.Stdin = strings.NewReader(`{"id":1,"image":7,"cache":true}` + "\n")
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return o.String(), e.String(), exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), 0
	}
	if stdout, stderr, code := worker(append(creds, "--strict")...); code != 0 || !strings.Contains(stdout, `"path":"computed"`) {
		t.Fatalf("worker with the CA and the password: exit %d\n%s%s", code, stdout, stderr)
	}
	if stdout, stderr, code := run(t, append([]string{"stats"}, creds...)...); code != 0 || !strings.Contains(stdout, "EMBCACHE_LEASES") {
		t.Fatalf("stats with the CA and the password: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, stderr, code := run(t, append([]string{"health"}, creds...)...); code != 0 {
		t.Fatalf("health with the CA and the password: exit %d\n%s", code, stderr)
	}

	for _, c := range []struct {
		what string
		args []string
		want string
	}{
		{"without the CA", []string{"--nats", url, "--user", "worker", "--password", "s3cret"}, "certificate signed by unknown authority"},
		{"without the password", []string{"--nats", url, "--nats-ca", certFile}, "Authorization Violation"},
	} {
		if _, stderr, code := run(t, append([]string{"stats", "--timeout", "2s"}, c.args...)...); code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("stats %s: exit %d, want 1 saying %q:\n%s", c.what, code, c.want, stderr)
		}
		if _, stderr, code := worker(append(c.args, "--strict")...); code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("strict worker %s: exit %d, want 1 saying %q:\n%s", c.what, code, c.want, stderr)
		}
		stdout, stderr, code := worker(c.args...)
		if code != 0 || !strings.Contains(stdout, `"path":"degraded"`) || !strings.Contains(stderr, "cannot connect to NATS") || !strings.Contains(stderr, c.want) {
			t.Errorf("worker %s: exit %d, want a degraded answer and a log saying %q:\n%s%s", c.what, code, c.want, stdout, stderr)
		}
	}

	// Flags that cannot work are usage errors, before any connection.
	for _, args := range [][]string{
		{"stats", "--nats", url, "--nats-cert", certFile},
		{"stats", "--nats", url, "--nats-ca", filepath.Join(dir, "missing.pem")},
		{"stats", "--nats", url, "--creds", filepath.Join(dir, "missing.creds")},
		{"stats", "--nats", url, "--creds", certFile},
		{"stats", "--nats", url, "--creds", certFile, "--user", "worker"},
		{"worker", "--nats", url, "--nats-key", keyFile},
		{"agent", "--socket", filepath.Join(dir, "a.sock"), "--nats", url, "--nats-ca", keyFile},
		{"serve", "--nats", url, "--nats-cert", certFile},
	} {
		if _, stderr, code := run(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s", args, code, stderr)
		}
	}
}

// TestCredsFile: --creds connects with a NATS credentials file (a user JWT
// and its seed) to a server that trusts the user's operator; without it,
// the connection is refused.
func TestCredsFile(t *testing.T) {
	dir := t.TempDir()
	operator, _ := nkeys.CreateOperator()
	opub, _ := operator.PublicKey()
	ojwt, err := jwt.NewOperatorClaims(opub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	account, _ := nkeys.CreateAccount()
	apub, _ := account.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt, err := ac.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	sys, _ := nkeys.CreateAccount() // JetStream needs the system account
	spub, _ := sys.PublicKey()
	sjwt, err := jwt.NewAccountClaims(spub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	useed, _ := user.Seed()
	ujwt, err := jwt.NewUserClaims(upub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(dir, "user.creds")
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(credsFile, creds, 0o600)

	port, _ := embedded.FreePort("127.0.0.1")
	conf := filepath.Join(dir, "server.conf")
	os.WriteFile(conf, fmt.Appendf(nil, "listen: 127.0.0.1:%d\noperator: %s\nsystem_account: %s\nresolver: MEMORY\n"+
		"resolver_preload: {%s: %s, %s: %s}\njetstream: {store_dir: %q}\n",
		port, ojwt, spub, spub, sjwt, apub, ajwt, filepath.Join(dir, "js")), 0o600)
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	if _, stderr, code := run(t, "health", "--nats", url, "--creds", credsFile); code != 0 {
		t.Fatalf("health with the credentials file: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "health", "--nats", url, "--timeout", "2s"); code != 1 || !strings.Contains(stderr, "Authorization Violation") {
		t.Fatalf("health without credentials: exit %d\n%s", code, stderr)
	}
}
