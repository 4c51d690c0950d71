package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// TLSConfig is the `tls:` section of config.yaml: HTTPS on the client
// listener.
type TLSConfig struct {
	// CertFile is the PEM certificate chain the client listener serves,
	// leaf first. With KeyFile, the listener speaks HTTPS (HTTP/1.1) only;
	// empty, plain HTTP. Both files are read again when their content
	// changes, checked at most every 5s as clients connect, so a renewed
	// certificate is served without a restart; connections already open
	// keep theirs. (default empty)
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is the PEM private key of CertFile. (default empty)
	KeyFile string `mapstructure:"key_file"`
}

// Validate reports every problem in c at once.
func (c TLSConfig) Validate() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("tls: cert_file and key_file go together: set both or neither")
	}
	return nil
}

// Enabled reports whether the client listener serves HTTPS.
func (c TLSConfig) Enabled() bool { return c.CertFile != "" }

// certCheckInterval is how often, at most, the certificate files are read
// again to see whether they changed.
const certCheckInterval = 5 * time.Second

// CertReloader serves the certificate in a pair of PEM files and reads
// them again when their content changes: [CertReloader.GetCertificate]
// looks at most every 5s, on a handshake, and a pair that does not load
// (a rotation half written, a key that does not match) leaves the
// certificate in force until a good pair replaces it. Its methods may be
// called concurrently.
type CertReloader struct {
	// immutable after NewCertReloader
	certFile, keyFile string
	logger            *slog.Logger

	cert atomic.Pointer[tls.Certificate]

	mu       sync.Mutex // held by the one handshake that checks the files; the others do not wait for it
	checked  time.Time  // guarded by mu
	certPEM  []byte     // guarded by mu; the files' content when cert was loaded, or last refused
	keyPEM   []byte     // guarded by mu
	failures int        // guarded by mu; pairs refused in a row
}

// NewCertReloader loads the pair c names. A nil logger discards.
func NewCertReloader(c TLSConfig, logger *slog.Logger) (*CertReloader, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: c.CertFile, keyFile: c.KeyFile, logger: logger}
	certPEM, keyPEM, err := r.read()
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file: %s and %s: %w", c.CertFile, c.KeyFile, err)
	}
	r.cert.Store(&cert)
	r.certPEM, r.keyPEM, r.checked = certPEM, keyPEM, time.Now()
	return r, nil
}

// read returns the content of both files, or an error naming each that
// could not be read.
func (r *CertReloader) read() (certPEM, keyPEM []byte, err error) {
	certPEM, certErr := os.ReadFile(r.certFile)
	if certErr != nil {
		certErr = fmt.Errorf("tls.cert_file: %w", certErr)
	}
	keyPEM, keyErr := os.ReadFile(r.keyFile)
	if keyErr != nil {
		keyErr = fmt.Errorf("tls.key_file: %w", keyErr)
	}
	if err := errors.Join(certErr, keyErr); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// GetCertificate is [tls.Config.GetCertificate]: the certificate in
// force, after reading the files again if the last look is 5s old.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if r.mu.TryLock() {
		if time.Since(r.checked) >= certCheckInterval {
			r.checkLocked()
		}
		r.mu.Unlock()
	}
	return r.cert.Load(), nil
}

// checkLocked reads the files and loads them if they changed. Caller
// must hold r.mu.
func (r *CertReloader) checkLocked() {
	r.checked = time.Now()
	certPEM, keyPEM, err := r.read()
	if err == nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return
	}
	var cert tls.Certificate
	if err == nil {
		r.certPEM, r.keyPEM = certPEM, keyPEM // a refused pair is not tried again until it changes
		cert, err = tls.X509KeyPair(certPEM, keyPEM)
	}
	if err != nil {
		if r.failures == 0 { // a transition, not every look
			r.logger.Warn("tls certificate not reloaded; the one in force keeps serving", "cert_file", r.certFile, "err", err)
		}
		r.failures++
		return
	}
	r.failures = 0
	r.cert.Store(&cert)
	attrs := []any{"cert_file", r.certFile}
	if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil {
		attrs = append(attrs, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
	}
	r.logger.Info("tls certificate reloaded", attrs...)
}

// TLSConfig returns the client listener's TLS settings: the reloaded
// certificate, TLS 1.2 or later, HTTP/1.1 only.
func (r *CertReloader) TLSConfig() *tls.Config {
	return &tls.Config{GetCertificate: r.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}

// BackendTLS returns the TLS settings for HTTPS backends that c asks for:
// the CA bundle that verifies them and the client certificate presented
// to them; nil when c sets neither (the system roots verify them). The
// error names every file that does not load, each by its key.
func (c Config) BackendTLS() (*tls.Config, error) {
	if c.BackendCAFile == "" && c.BackendCertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	var errs []error
	if c.BackendCAFile != "" {
		pem, err := os.ReadFile(c.BackendCAFile)
		tc.RootCAs = x509.NewCertPool()
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("proxy.backend_ca_file: %w", err))
		case !tc.RootCAs.AppendCertsFromPEM(pem):
			errs = append(errs, fmt.Errorf("proxy.backend_ca_file: no PEM certificate in %s", c.BackendCAFile))
		}
	}
	if c.BackendCertFile != "" {
		certPEM, certErr := os.ReadFile(c.BackendCertFile)
		if certErr != nil {
			errs = append(errs, fmt.Errorf("proxy.backend_cert_file: %w", certErr))
		}
		keyPEM, keyErr := os.ReadFile(c.BackendKeyFile)
		if keyErr != nil {
			errs = append(errs, fmt.Errorf("proxy.backend_key_file: %w", keyErr))
		}
		if certErr == nil && keyErr == nil {
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				errs = append(errs, fmt.Errorf("proxy.backend_cert_file: %s and %s: %w", c.BackendCertFile, c.BackendKeyFile, err))
			}
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return tc, nil
}
