package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/internal/testcert"
	"go.yaml.in/yaml/v3"
)

// serveVerdict runs what `llmlb serve` runs on the file at path up to
// listening, config.Load and serve.Start, on free loopback ports instead
// of the file's addresses, and shuts it down again. It returns why serve
// would refuse the file, or nil.
func serveVerdict(t *testing.T, path string) error {
	t.Helper()
	cfg, err := config.Load(path, noEnv)
	if err != nil {
		return err
	}
	cfg.Listen = "127.0.0.1:0"
	if cfg.Admin.Listen != "" {
		cfg.Admin.Listen = "127.0.0.1:0"
	}
	ctx, cancel := context.WithCancel(t.Context())
	inst, err := serve.Start(ctx, cfg, nil, io.Discard)
	cancel()
	if err != nil {
		return err
	}
	if err := inst.Wait(); err != nil {
		t.Errorf("%s: serve stopped with %v", path, err)
	}
	return nil
}

// TestValidateAgreesWithServe: on every config in examples/, config.yaml
// and broken ones (a certificate missing, a CA that is not PEM), `llmlb
// validate` refuses exactly what serve refuses before it listens, and
// names every file that does not load in one run (issue 54; newcomer
// report item 2).
func TestValidateAgreesWithServe(t *testing.T) {
	dir := t.TempDir()
	paths := exampleConfigs(t, dir)
	paths = append(paths, "config.yaml")

	ca := testcert.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 2, "localhost")
	cert := testcert.Write(t, dir, "cert.pem", certPEM)
	key := testcert.Write(t, dir, "key.pem", keyPEM)
	caFile := testcert.Write(t, dir, "ca.pem", ca.PEM)
	notPEM := testcert.Write(t, dir, "not.pem", []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")
	const backends = "backends:\n  - url: http://127.0.0.1:8001\n"
	broken := map[string]struct {
		body     string
		wantKeys []string // named in validate's problems; none: both accept it
	}{
		"good-files.yaml": {"tls:\n  cert_file: " + cert + "\n  key_file: " + key + "\nproxy:\n  backend_ca_file: " + caFile +
			"\n  backend_cert_file: " + cert + "\n  backend_key_file: " + key + "\n", nil},
		"missing-cert.yaml": {"tls:\n  cert_file: " + missing + "\n  key_file: " + key + "\n", []string{"tls.cert_file"}},
		"ca-not-pem.yaml":   {"proxy:\n  backend_ca_file: " + notPEM + "\n", []string{"proxy.backend_ca_file"}},
		"both.yaml": {"tls:\n  cert_file: " + cert + "\n  key_file: " + missing + "\nproxy:\n  backend_ca_file: " + notPEM +
			"\n  backend_cert_file: " + notPEM + "\n  backend_key_file: " + key + "\n",
			[]string{"tls.key_file", "proxy.backend_ca_file", "proxy.backend_cert_file"}},
	}
	wantKeys := map[string][]string{
		"examples/keys-and-tls.yaml": {"tls.cert_file", "tls.key_file", "proxy.backend_ca_file"},
	}
	for name, b := range broken {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(b.body+backends), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
		wantKeys[path] = b.wantKeys
	}

	for _, path := range paths {
		t.Run(strings.TrimPrefix(path, dir+"/"), func(t *testing.T) {
			stdout, stderr, validateErr := runCmd(t, noEnv, "validate", path)
			serveErr := serveVerdict(t, path)
			if (validateErr == nil) != (serveErr == nil) {
				t.Fatalf("validate says %q%q, serve says %v", stdout, stderr, serveErr)
			}
			for _, k := range wantKeys[path] {
				if !strings.Contains(stderr, path+": "+k+": ") {
					t.Errorf("validate does not name %s:\n%s", k, stderr)
				}
			}
			if len(wantKeys[path]) == 0 && !strings.HasPrefix(stdout, path+": ok (") {
				t.Errorf("validate printed %q, want %q", stdout, path+": ok (...)")
			}
		})
	}
	if len(paths) < 12 {
		t.Errorf("only %d configs compared", len(paths))
	}
}

// exampleConfigs returns the path of every llmlb config under examples/:
// the files with a top-level backends key, and the config.yaml of each
// Kubernetes ConfigMap, written to dir.
func exampleConfigs(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir("examples", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains("\n"+string(b), "\nbackends:") {
			paths = append(paths, path)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc struct {
				Kind     string
				Metadata struct{ Name string }
				Data     map[string]string
			}
			if err := dec.Decode(&doc); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return nil // not a manifest: compose files, dashboards
			}
			if text, ok := doc.Data["config.yaml"]; ok && doc.Kind == "ConfigMap" {
				p := filepath.Join(dir, "configmap-"+doc.Metadata.Name+".yaml")
				if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
					return err
				}
				paths = append(paths, p)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// TestValidateSaysWhatItCounts: the ok line counts backends and DNS
// discovery entries apart, singular and plural (newcomer report item 16).
func TestValidateSaysWhatItCounts(t *testing.T) {
	tests := []struct {
		name, backends, want string
	}{
		{"one", "  - url: http://127.0.0.1:8001\n", "ok (1 backend)"},
		{"two", "  - url: http://127.0.0.1:8001\n  - url: http://127.0.0.1:8002\n", "ok (2 backends)"},
		{"discovery", "  - dns: vllm.internal\n    ports: [8000]\n  - srv: _vllm._tcp.internal\n", "ok (2 DNS discovery entries)"},
		{"both", "  - url: http://127.0.0.1:8001\n  - dns: vllm.internal\n    ports: [8000]\n", "ok (1 backend, 1 DNS discovery entry)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, "backends:\n"+tt.backends)
			stdout, stderr, err := runCmd(t, noEnv, "validate", path)
			if want := path + ": " + tt.want + "\n"; err != nil || stdout != want {
				t.Errorf("validate = %q, %v (%s); want %q", stdout, err, stderr, want)
			}
		})
	}
}
