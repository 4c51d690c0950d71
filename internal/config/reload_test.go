package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/scrape"
)

// TestEveryKeyHasAReloadClass: each key config.yaml may set lies in
// exactly one section, and each section says what a reload does with it
// in a `reload` tag, apply or restart; an untagged field would be left
// to restart silently.
func TestEveryKeyHasAReloadClass(t *testing.T) {
	sections := Sections()
	for _, s := range sections {
		if tag := reflect.TypeFor[Config]().FieldByIndex(s.index).Tag.Get("reload"); tag != "apply" && tag != "restart" {
			t.Errorf("section %s: reload tag %q, want apply or restart", s.Key, tag)
		}
	}
	for _, k := range Keys() {
		n := 0
		for _, s := range sections {
			if k == s.Key || strings.HasPrefix(k, s.Key+".") || strings.HasPrefix(k, s.Key+"[") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("key %s lies in %d sections, want 1", k, n)
		}
	}
	i := slices.IndexFunc(sections, func(s Section) bool { return s.Key == "tracing" })
	if i < 0 || sections[i].Apply {
		t.Errorf("tracing is not a section that needs a restart: %+v", sections)
	}
}

// TestChangesNameOnlyWhatDiffers: a reload names the sections that
// differ from the running config, split into those applied and those
// that need a restart; what Load derives (balancer.max_candidates from
// proxy.max_attempts) is not a change of its own.
func TestChangesNameOnlyWhatDiffers(t *testing.T) {
	running := DefaultConfig()
	running.Backends = []scrape.BackendConfig{{URL: "http://127.0.0.1:8001"}}
	tests := []struct {
		name        string
		change      func(*Config)
		wantApplied []string
		wantRestart []string
	}{
		{"nothing", func(*Config) {}, nil, nil},
		{"tracing", func(c *Config) { c.Tracing.Endpoint = "http://collector:4318" }, nil, []string{"tracing"}},
		{"max_attempts alone", func(c *Config) { c.Proxy.MaxAttempts = 5; c.Balancer.MaxCandidates = 5 }, nil, []string{"proxy"}},
		{"log level and format", func(c *Config) { c.Log.Level = "debug"; c.Log.Format = "json" }, []string{"log.level"}, []string{"log.format"}},
		{"backends and listen", func(c *Config) {
			c.Backends = append(c.Backends, scrape.BackendConfig{URL: "http://127.0.0.1:8002"})
			c.Listen = "127.0.0.1:8081"
		}, []string{"backends"}, []string{"listen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := running
			next.Backends = slices.Clone(running.Backends)
			tt.change(&next)
			applied, restart := Changes(running, next)
			if !slices.Equal(applied, tt.wantApplied) || !slices.Equal(restart, tt.wantRestart) {
				t.Errorf("Changes = %q, %q; want %q, %q", applied, restart, tt.wantApplied, tt.wantRestart)
			}
		})
	}
}

// TestInForceKeepsWhatNeedsARestart: after a reload, the config in force
// has the new file's applied sections and the old restart-only ones, so
// reverting a restart-only setting to the running value is no change,
// and repeating the change still is one (issue 54; newcomer report item 7).
func TestInForceKeepsWhatNeedsARestart(t *testing.T) {
	first := DefaultConfig()
	first.Backends = []scrape.BackendConfig{{URL: "http://127.0.0.1:8001"}}
	second := first
	second.Proxy.MaxAttempts, second.Balancer.MaxCandidates = 7, 7
	second.Backends = []scrape.BackendConfig{{URL: "http://127.0.0.1:8002"}}

	running := InForce(first, second)
	if running.Proxy.MaxAttempts != first.Proxy.MaxAttempts || running.Balancer.MaxCandidates != first.Balancer.MaxCandidates {
		t.Errorf("in force: max_attempts %d, max_candidates %d; want the running %d", running.Proxy.MaxAttempts, running.Balancer.MaxCandidates, first.Proxy.MaxAttempts)
	}
	if !reflect.DeepEqual(running.Backends, second.Backends) {
		t.Errorf("in force: backends %v, want the new file's %v", running.Backends, second.Backends)
	}
	reverted := first
	reverted.Backends = second.Backends
	if applied, restart := Changes(running, reverted); applied != nil || restart != nil {
		t.Errorf("reverting max_attempts: Changes = %q, %q; want none", applied, restart)
	}
	if _, restart := Changes(running, second); !slices.Equal(restart, []string{"proxy"}) {
		t.Errorf("the same change again: restart %q, want [proxy]", restart)
	}
}

// TestOperationsDocListsReloadClasses holds docs/operations.md's reload
// paragraph to [Sections]: the sentence of what takes effect at once
// names every section a reload applies, the one of what needs a restart
// every other, and neither names one of the other's.
func TestOperationsDocListsReloadClasses(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(b)), " ")
	sentence := func(from, to string) string {
		i := strings.Index(text, from)
		j := strings.Index(text[i+1:], to)
		if i < 0 || j < 0 {
			t.Fatalf("docs/operations.md has no %q ... %q", from, to)
		}
		return text[i : i+1+j]
	}
	lists := map[bool]string{
		true:  sentence("Otherwise these take effect at once:", "Backends whose entry"),
		false: sentence("The other settings (", "need a restart"),
	}
	code := regexp.MustCompile("`([a-z_.]+)`")
	for apply, s := range lists {
		named := map[string]bool{}
		for _, m := range code.FindAllStringSubmatch(s, -1) {
			named[m[1]] = true
		}
		for _, sec := range Sections() {
			if named[sec.Key] != (sec.Apply == apply) {
				t.Errorf("docs/operations.md: %q names %s: %v; it is applied by a reload: %v", s, sec.Key, named[sec.Key], sec.Apply)
			}
		}
	}
}
