package balancer

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// TestPeerPresetsNeverQueue: the endpoint picker's default profile and
// llm-d's optimized baseline have no saturation filter and no queue, so a
// backend holding the prompt keeps it however long its queue, and a fleet
// that is all saturated still gets the request; llmlb's own policy filters
// and queues.
func TestPeerPresetsNeverQueue(t *testing.T) {
	long := []byte(strings.Repeat("a long shared system prompt ", 200))
	for _, tc := range []struct {
		policy      string
		wantHolder  bool
		wantRefused error
	}{
		{"epp", true, nil},
		{"llm-d-load", true, nil},
		{"llm-d-optimized", true, nil},
		{"dynamo-kv", true, nil},
		{"ttft", false, ErrSaturated},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			b := newBal(t, tc.policy)
			b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
			req := &Request{Model: "m", Prompt: long, PromptTokens: len(long) / 4}
			d, err := b.Pick(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			home := d.Candidates[0].ID
			b.Update(ready(home, 100, 0, 0)) // far past saturation.queue 16
			d, err = b.Pick(req, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Candidates[0].ID == home; got != tc.wantHolder {
				t.Errorf("Pick with the holder saturated chose %s, holder %s: chose holder %v, want %v", d.Candidates[0].ID, home, got, tc.wantHolder)
			}
			b.Update(ready("a", 100, 0, 0), ready("b", 100, 0, 0), ready("c", 100, 0, 0))
			if _, err := b.Pick(&Request{Model: "m", Prompt: []byte("another prompt")}, nil); !errors.Is(err, tc.wantRefused) {
				t.Errorf("Pick on a saturated fleet: %v, want %v", err, tc.wantRefused)
			}
		})
	}
}

// TestPresetsCiteWhatTheyFollow: every peer's preset names the file and
// commit (or the publication) it follows.
func TestPresetsCiteWhatTheyFollow(t *testing.T) {
	cite := regexp.MustCompile(` at [0-9a-f]{7,40}\b|lmsys\.org/blog/`)
	for _, p := range Presets() {
		if strings.HasPrefix(p.Name, "ttft") {
			continue // llmlb's own
		}
		if !cite.MatchString(p.Follows) {
			t.Errorf("preset %s follows %q: no file at a commit, nor a publication", p.Name, p.Follows)
		}
	}
	if _, err := LookupPreset("nope"); err == nil {
		t.Error("LookupPreset(nope) = nil error")
	}
}
