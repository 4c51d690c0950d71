package e2e

import (
	"testing"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/doccheck"
)

// The examples' own checks read files only and are in internal/doccheck,
// where make check's go test -short runs them; these are its readers as
// the e2e tests call them.

func loadExampleConfig(t *testing.T, name, text string) config.Config {
	t.Helper()
	return doccheck.LoadConfig(t, name, text)
}

func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	return doccheck.ReadYAML(t, path)
}

func dig(v any, path ...any) any { return doccheck.Dig(v, path...) }
