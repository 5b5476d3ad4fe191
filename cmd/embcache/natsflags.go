package main

import (
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// natsFlags say how a command connects to NATS as a client: the URL, the
// credentials and the client's TLS. Every command that connects takes
// them (worker, agent, serve, the inspection commands), with one meaning
// each. serve's --tls-cert, --tls-key and --tls-ca are its embedded
// server's, not these.
type natsFlags struct {
	url        string
	user, pass string
	creds      string // a NATS credentials file (user JWT and seed)
	ca         string // CA to verify the server with
	cert, key  string // the client's certificate and key (mutual TLS)
}

// register adds the client flags with their usual meaning: --nats is the
// server to connect to ($EMBCACHE_NATS, else the local default).
func (f *natsFlags) register(fs *pflag.FlagSet) {
	f.add(fs, envOr("EMBCACHE_NATS", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated ($EMBCACHE_NATS)", "NATS user")
}

// add adds the flags, with the URL's default and help and the user's help
// the command gives (serve embeds a server unless --nats is set, and
// requires its --user of clients).
func (f *natsFlags) add(fs *pflag.FlagSet, urlDefault, urlHelp, userHelp string) {
	fs.StringVar(&f.url, "nats", urlDefault, urlHelp)
	fs.StringVar(&f.user, "user", "", userHelp)
	fs.StringVar(&f.pass, "password", envOr("EMBCACHE_NATS_PASSWORD", ""), "the password of --user ($EMBCACHE_NATS_PASSWORD)")
	fs.StringVar(&f.creds, "creds", envOr("EMBCACHE_NATS_CREDS", ""), "NATS credentials file (user JWT and seed), instead of --user ($EMBCACHE_NATS_CREDS)")
	fs.StringVar(&f.ca, "nats-ca", "", "CA (PEM) to verify the NATS server's TLS certificate with (default: the system's)")
	fs.StringVar(&f.cert, "nats-cert", "", "client TLS certificate (PEM) to present to NATS (mutual TLS; with --nats-key)")
	fs.StringVar(&f.key, "nats-key", "", "its key (PEM)")
}

// hasTLS reports whether a client TLS flag is set.
func (f *natsFlags) hasTLS() bool { return f.ca != "" || f.cert != "" || f.key != "" }

// options are the connection options the flags ask for. Flags that do
// not go together, and files that cannot be read or parsed, are usage
// errors that name the flag (not a connection error, after a wait).
func (f *natsFlags) options() ([]nats.Option, error) {
	if f.creds != "" && f.user != "" {
		return nil, usagef("--creds and --user: give one or the other")
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usagef("--nats-cert and --nats-key go together")
	}
	var opts []nats.Option
	check := func(flag string, opt nats.Option) error {
		if err := opt(&nats.Options{}); err != nil { // the option reads its files now
			return usagef("%s: %v", flag, err)
		}
		opts = append(opts, opt)
		return nil
	}
	if f.user != "" {
		opts = append(opts, nats.UserInfo(f.user, f.pass))
	}
	if f.creds != "" {
		opt := nats.UserCredentials(f.creds)
		var o nats.Options
		if err := opt(&o); err != nil {
			return nil, usagef("--creds: %v", err)
		}
		// It reads the file only when it connects: read it now.
		if _, err := o.UserJWT(); err != nil {
			return nil, usagef("--creds %s: %v", f.creds, err)
		}
		if _, err := o.SignatureCB([]byte("embcache")); err != nil {
			return nil, usagef("--creds %s: %v", f.creds, err)
		}
		opts = append(opts, opt)
	}
	if f.ca != "" {
		if err := check("--nats-ca", nats.RootCAs(f.ca)); err != nil {
			return nil, err
		}
	}
	if f.cert != "" {
		if err := check("--nats-cert", nats.ClientCert(f.cert, f.key)); err != nil {
			return nil, err
		}
	}
	return opts, nil
}
