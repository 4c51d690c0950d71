// Package doccheck holds README.md, docs/ and examples/ to the code: its
// tests check that the configs they show load, their links lead
// somewhere, the metrics table is the metrics the code registers, the
// example configs validate and the deployment files agree with them. They
// read files only, start no process and need no network, so that make
// check's go test -short runs them; e2e/ keeps what runs llmlb. The
// readers below are the ones e2e's tests share.
package doccheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/llmlb/llmlb/internal/config"
)

// Fenced returns the bodies of the fenced code blocks of md whose info
// string is lang ("" for every block).
func Fenced(md, lang string) []string {
	var out []string
	var body []string
	in, keep := false, false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			if in {
				if keep {
					out = append(out, strings.Join(body, "\n"))
				}
				in, body = false, nil
				continue
			}
			in = true
			keep = lang == "" || strings.TrimSpace(strings.TrimPrefix(line, "```")) == lang
			continue
		}
		if in {
			body = append(body, line)
		}
	}
	return out
}

// LoadConfig validates an llmlb config given as text, as `llmlb validate`
// would the file, with no LLMLB_ variables set, and returns it; name says
// where the text is from.
func LoadConfig(t testing.TB, name, text string) config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, config.Environ{})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return cfg
}

// ReadYAML reads every document of a YAML file as a map.
func ReadYAML(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// Dig walks maps and lists by key or index; nil where the path leads
// nowhere.
func Dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// MetricsPage is the page, under the repository's root, whose table
// documents every metric llmlb registers.
const MetricsPage = "docs/operations.md"

// DocumentedMetrics reads the metric names of the metrics table of page.
func DocumentedMetrics(t testing.TB, page string) []string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(llmlb_[a-z_]+)` \\| (counter|gauge|histogram) \\|").FindAllSubmatch(b, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) < 20 {
		t.Fatalf("%s: the metrics table has %d rows", page, len(names))
	}
	return names
}

// DashboardQueries returns every PromQL expression of the Grafana
// dashboard at path, with its panel title.
func DashboardQueries(t testing.TB, path string) [][2]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out [][2]string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				out = append(out, [2]string{p.Title, tg.Expr})
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}
