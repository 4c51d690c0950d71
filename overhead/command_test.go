package overhead

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOverheadCommandRefusesNonPositive: a duration or scale that is not positive
// is refused before anything runs or is created.
func TestOverheadCommandRefusesNonPositive(t *testing.T) {
	for _, tt := range []struct {
		name            string
		duration        time.Duration
		scale           float64
		wantErrContains string
	}{
		{"zero duration", 0, 1, "--duration and --scale must be positive"},
		{"negative duration", -time.Second, 1, "--duration and --scale must be positive"},
		{"zero scale", time.Second, 0, "--duration and --scale must be positive"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "profiles")
			c := Command{Options: Options{Proxies: []string{"direct"}, Duration: tt.duration, Scale: tt.scale, ProfileDir: dir}}
			var out strings.Builder
			if err := c.Run(context.Background(), &out); err == nil || !strings.Contains(err.Error(), tt.wantErrContains) {
				t.Errorf("Run() = %v, want an error saying %q", err, tt.wantErrContains)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) || out.Len() > 0 {
				t.Errorf("a refused command made its profile directory (%v) or printed %q", err, out.String())
			}
		})
	}
}

// TestOverheadCommandWritesTableAndJSON runs the direct row's latency scenario
// briefly: the table is printed, the report written as JSON, and the
// profile directory made.
func TestOverheadCommandWritesTableAndJSON(t *testing.T) {
	dir := t.TempDir()
	c := Command{Options: Options{Proxies: []string{"direct"}, Scenarios: []string{"latency"}, Duration: 100 * time.Millisecond,
		Scale: 0.05, ProfileDir: filepath.Join(dir, "profiles")}, JSONFile: filepath.Join(dir, "o.json")}
	var out strings.Builder
	if err := c.Run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "direct") || !strings.Contains(out.String(), "lat p50") {
		t.Errorf("table:\n%s", out.String())
	}
	b, err := os.ReadFile(c.JSONFile)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Rows) != 1 || rep.Rows[0].Proxy != "direct" || len(rep.Rows[0].Cells) != 1 ||
		rep.Rows[0].Cells[0].Requests == 0 || rep.Rows[0].Cells[0].Errors != 0 {
		t.Errorf("report %s: %v", b, err)
	}
	if fi, err := os.Stat(c.ProfileDir); err != nil || !fi.IsDir() {
		t.Errorf("profile directory: %v", err)
	}
}
