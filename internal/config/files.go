package config

import (
	"crypto/tls"
	"errors"
	"log/slog"

	"github.com/llmlb/llmlb/cluster"
	"github.com/llmlb/llmlb/proxy"
)

// Files is what the files a config names hold, read and parsed: the
// certificates, keys and CA bundles serve opens before it listens.
type Files struct {
	// Certs serves tls.cert_file with tls.key_file on the client
	// listener and reads them again when they change; nil when tls is off.
	Certs *proxy.CertReloader
	// BackendTLS verifies HTTPS backends with proxy.backend_ca_file and
	// presents proxy.backend_cert_file to them; nil when neither is set
	// (the system roots verify them).
	BackendTLS *tls.Config
	// Cluster is what cluster.redis's password and CA files hold.
	Cluster cluster.Files
	// CaptureSalt is capture.salt or capture.salt_file's content; nil
	// for neither (a random salt per capture).
	CaptureSalt []byte
}

// OpenFiles reads and parses every file c names. It is the whole of what
// serve checks of a loaded config before it listens, and `llmlb validate`
// runs it too ([Check]), so the two agree on every config. The error
// lists every file that does not load, each by its key. A nil logger
// discards what the certificate reloader logs.
func (c Config) OpenFiles(logger *slog.Logger) (Files, error) {
	var f Files
	var errs []error
	if c.TLS.Enabled() {
		certs, err := proxy.NewCertReloader(c.TLS, logger)
		f.Certs = certs
		errs = append(errs, err)
	}
	backendTLS, err := c.Proxy.BackendTLS()
	f.BackendTLS = backendTLS
	errs = append(errs, err)
	f.Cluster, err = c.Cluster.OpenFiles()
	errs = append(errs, err)
	f.CaptureSalt, err = c.Capture.LoadSalt()
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return Files{}, err
	}
	return f, nil
}

// Check loads path as [Load] does and opens the files the config names as
// serve does before it listens ([Config.OpenFiles]). It returns a
// [*Error] listing every problem of both at once: `llmlb validate` runs
// it, and `llmlb serve` before it starts.
func Check(path string, env Environ) (Config, error) {
	cfg, problems, read := load(path, env)
	if read {
		// A pair set by half is a problem Validate names; opening it
		// would name it again.
		c := cfg
		if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
			c.TLS = proxy.TLSConfig{}
		}
		if (c.Proxy.BackendCertFile == "") != (c.Proxy.BackendKeyFile == "") {
			c.Proxy.BackendCertFile, c.Proxy.BackendKeyFile = "", ""
		}
		_, err := c.OpenFiles(nil)
		problems = append(problems, unjoin(err)...)
	}
	if len(problems) > 0 {
		return Config{}, &Error{File: path, Problems: problems}
	}
	return cfg, nil
}
