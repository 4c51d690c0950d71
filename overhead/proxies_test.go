package overhead

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/llmlb/llmlb/capture"
	"github.com/llmlb/llmlb/internal/config"
)

// TestLLMLBCaptureRowCapturesEveryRequest: the llmlb-capture row's config
// loads as `llmlb serve` loads it, with capture on, every request
// sampled, into the run's directory, and a salt long enough; the llmlb
// row's is the same with capture off. A capture row without capture
// would measure llmlb alone (issue 57's bound).
func TestLLMLBCaptureRowCapturesEveryRequest(t *testing.T) {
	load := func(name string) (config.Config, string) {
		t.Helper()
		dir := t.TempDir()
		path, err := writeLLMLBConfig(name, "http://127.0.0.1:1", "", "", dir)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, config.Environ{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return cfg, dir
	}
	cfg, dir := load("llmlb-capture")
	c := cfg.Capture
	if !c.Enabled() || c.Path != capturePath(dir) || c.Sample != 1 {
		t.Errorf("llmlb-capture: capture %+v, want on at %s with sample 1", c, capturePath(dir))
	}
	if salt, err := c.LoadSalt(); err != nil || len(salt) < capture.MinSalt {
		t.Errorf("llmlb-capture: salt %q, %v; want at least %d bytes", salt, err, capture.MinSalt)
	}
	if plain, _ := load("llmlb"); plain.Capture.Enabled() {
		t.Errorf("llmlb: capture on at %s", plain.Capture.Path)
	}
	if h, session := rowRequest("llmlb-capture"); h != nil || session != "" {
		t.Errorf("llmlb-capture sends a key or session (%v, %q); it is the llmlb row with capture on", h, session)
	}
}

// TestCaptureLinesCountsAndRemoves: the lines of a capture and of its
// rotated files are counted, and the files removed, so that a second
// llmlb-capture row of the same run counts only its own.
func TestCaptureLinesCountsAndRemoves(t *testing.T) {
	path := capturePath(t.TempDir())
	for p, text := range map[string]string{path: "{}\n{}\n", path + ".1": "{}\n", path + ".2": ""} {
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := captureLines(path); n != 3 || err != nil {
		t.Errorf("captureLines = %d, %v; want 3", n, err)
	}
	if left, _ := filepath.Glob(path + "*"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if n, err := captureLines(path); err == nil {
		t.Errorf("captureLines of no capture = %d, nil; want an error", n)
	}
}

// TestRowEnvDropsLLMLBVariables: a row's process does not inherit llmlb's
// own variables, which would override the config the row writes.
func TestRowEnvDropsLLMLBVariables(t *testing.T) {
	got := rowEnv([]string{"PATH=/bin", "LLMLB_CAPTURE_SALT=a salt of sixteen bytes", "HOME=/root", "LLMLB_LISTEN=:1"})
	if !slices.Equal(got, []string{"PATH=/bin", "HOME=/root"}) {
		t.Errorf("rowEnv = %v", got)
	}
}
