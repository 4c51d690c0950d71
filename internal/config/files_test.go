package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/testcert"
)

// TestCheckNamesEveryFileThatDoesNotLoad: validate's check reads every
// file the config names and reports each that is missing or is not PEM,
// by key, all in one run and beside the file's other problems; a config
// whose files load passes.
func TestCheckNamesEveryFileThatDoesNotLoad(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 2, "localhost")
	cert := testcert.Write(t, dir, "cert.pem", certPEM)
	key := testcert.Write(t, dir, "key.pem", keyPEM)
	caFile := testcert.Write(t, dir, "ca.pem", ca.PEM)
	notPEM := testcert.Write(t, dir, "not.pem", []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name     string
		body     string
		wantKeys []string // the keys the problems name, in order; none: ok
		loadToo  bool     // Load, which reads no file, refuses it too
	}{
		{"files load", "tls:\n  cert_file: " + cert + "\n  key_file: " + key + "\nproxy:\n  backend_ca_file: " + caFile +
			"\n  backend_cert_file: " + cert + "\n  backend_key_file: " + key + "\n", nil, false},
		{"missing certificate", "tls:\n  cert_file: " + missing + "\n  key_file: " + key + "\n", []string{"tls.cert_file"}, false},
		{"missing pair", "tls:\n  cert_file: " + missing + "\n  key_file: " + missing + "\n", []string{"tls.cert_file", "tls.key_file"}, false},
		{"certificate not PEM", "tls:\n  cert_file: " + notPEM + "\n  key_file: " + key + "\n", []string{"tls.cert_file"}, false},
		{"CA not PEM", "proxy:\n  backend_ca_file: " + notPEM + "\n", []string{"proxy.backend_ca_file"}, false},
		{"everything at once", "tls:\n  cert_file: " + missing + "\n  key_file: " + key + "\nproxy:\n  max_attempt: 2\n  backend_ca_file: " + missing +
			"\n  backend_cert_file: " + cert + "\n  backend_key_file: " + missing + "\n",
			[]string{"unknown key \"proxy.max_attempt\" (did you mean \"max_attempts\"?)", "tls.cert_file", "proxy.backend_ca_file", "proxy.backend_key_file"}, true},
		{"a pair set by half is named once", "tls:\n  cert_file: " + missing + "\n", []string{"tls"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body+"backends:\n  - url: http://127.0.0.1:8001\n")
			_, err := config.Check(path, noEnv)
			var keys []string
			if err != nil {
				for _, line := range strings.Split(err.Error(), "\n") {
					key, _, _ := strings.Cut(strings.TrimPrefix(line, path+": "), ":")
					keys = append(keys, key)
				}
			}
			if !slices.Equal(keys, tt.wantKeys) {
				t.Errorf("Check names %q, want %q; err:\n%v", keys, tt.wantKeys, err)
			}
			if _, err := config.Load(path, noEnv); (err != nil) != tt.loadToo {
				t.Errorf("Load = %v, want an error: %v", err, tt.loadToo)
			}
		})
	}
}

// TestCheckReadsEveryFileKey: every key that names a file (…_file) is
// read by Check: with the others naming good files, that one missing is
// a problem naming it, so a file key added later cannot be left to fail
// only when serve starts.
func TestCheckReadsEveryFileKey(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 2, "localhost")
	good := map[string]string{ // by how the key ends
		"cert_file":     testcert.Write(t, dir, "cert.pem", certPEM),
		"key_file":      testcert.Write(t, dir, "key.pem", keyPEM),
		"ca_file":       testcert.Write(t, dir, "ca.pem", ca.PEM),
		"password_file": testcert.Write(t, dir, "password", []byte("secret\n")),
		"salt_file":     testcert.Write(t, dir, "salt", []byte("a salt of sixteen bytes or more\n")),
	}
	var fileKeys []string
	for _, k := range config.Keys() {
		if strings.HasSuffix(k, "_file") {
			fileKeys = append(fileKeys, k)
		}
	}
	if len(fileKeys) < 5 {
		t.Fatalf("file keys %q: want at least tls's two and proxy's three", fileKeys)
	}
	for _, missing := range fileKeys {
		tree := map[string]any{}
		for _, k := range fileKeys {
			parts := strings.Split(k, ".")
			if len(parts) < 2 || strings.ContainsAny(k, "[<") {
				t.Fatalf("%s: the test writes keys of sections only", k)
			}
			path := ""
			for kind, p := range good {
				if strings.HasSuffix(parts[len(parts)-1], kind) {
					path = p
				}
			}
			if path == "" {
				t.Fatalf("%s: the test has no good file for it", k)
			}
			if k == missing {
				path = filepath.Join(dir, "missing.pem")
			}
			node := tree
			for _, p := range parts[:len(parts)-1] {
				if node[p] == nil {
					node[p] = map[string]any{}
				}
				node = node[p].(map[string]any)
			}
			node[parts[len(parts)-1]] = path
		}
		body, err := yaml.Marshal(tree)
		if err != nil {
			t.Fatal(err)
		}
		path := writeConfig(t, string(body)+"backends:\n  - url: http://127.0.0.1:8001\n")
		_, err = config.Check(path, noEnv)
		if err == nil || !strings.Contains(err.Error(), path+": "+missing+": ") {
			t.Errorf("%s missing: Check = %v, want a problem naming it", missing, err)
		}
	}
}

// TestConfigurationDocNamesTheFilesValidateReads: docs/configuration.md's
// paragraph on validate names every key whose file it reads.
func TestConfigurationDocNamesTheFilesValidateReads(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "`llmlb validate PATH` runs the checks")
	if i < 0 {
		t.Fatal("docs/configuration.md has no paragraph on validate")
	}
	para, _, _ := strings.Cut(text[i:], "\n\n")
	for _, k := range config.Keys() {
		if strings.HasSuffix(k, "_file") && !strings.Contains(para, "`"+k+"`") {
			t.Errorf("docs/configuration.md's paragraph on validate does not name %s", k)
		}
	}
}
