package balancer

import (
	"strings"
	"testing"
	"time"
)

func TestSGLangCacheAware(t *testing.T) {
	b := newBal(t, "sglang-cache-aware", func(c *Config, _ *Deps) { c.SGLang.BalanceAbsThreshold = 2 })
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	long := strings.Repeat("shared system prompt ", 50)
	d := mustPick(t, b, &Request{Model: "m", Prompt: []byte(long + "q1")}, nil)
	home := d.Candidates[0]
	if d.Reason != "least-load" {
		t.Errorf("first prompt reason %q, want least-load (nothing matched)", d.Reason)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q2")}, nil)
	if d.Candidates[0] != home || d.Reason != "prefix-hit" {
		t.Errorf("shared prompt went to %s (%s), want %s prefix-hit", d.Candidates[0].ID, d.Reason, home.ID)
	}
	// A miss goes to the least loaded backend, not to the smallest tree
	// (sglang PR #14650).
	g := NewGuard()
	g.Attach(home, Work{}, time.Now())
	defer g.Release()
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte("something else entirely")}, nil)
	if d.Candidates[0] == home || d.Reason != "least-load" {
		t.Errorf("unrelated prompt went to %s (%s), want a least-loaded backend", d.Candidates[0].ID, d.Reason)
	}
	// A holder over 1.5× the mean load and over the mean + 2 spills to the
	// least loaded backend.
	for range 4 {
		g := NewGuard()
		g.Attach(home, Work{}, time.Now())
		defer g.Release()
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q3")}, nil)
	if d.Candidates[0] == home || d.Reason != "least-load" {
		t.Errorf("overloaded holder: %s (%s), want a least-loaded backend", d.Candidates[0].ID, d.Reason)
	}
}

func TestSGLangV04CacheAware(t *testing.T) {
	b := newBal(t, "sglang-v04-cache-aware")
	b.Update(ready("a", 0, 0, 0), ready("b", 0, 0, 0), ready("c", 0, 0, 0))
	long := strings.Repeat("shared system prompt ", 50)
	d := mustPick(t, b, &Request{Model: "m", Prompt: []byte(long + "q1")}, nil)
	home := d.Candidates[0]
	if d.Reason != "cache-space" {
		t.Errorf("first prompt reason %q, want cache-space (nothing matched: smallest tree)", d.Reason)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte(long + "q2")}, nil)
	if d.Candidates[0] != home || d.Reason != "prefix-hit" {
		t.Errorf("shared prompt went to %s (%s), want %s prefix-hit", d.Candidates[0].ID, d.Reason, home.ID)
	}
	d, _ = b.Pick(&Request{Model: "m", Prompt: []byte("something else entirely")}, nil)
	if d.Candidates[0] == home || d.Reason != "cache-space" {
		t.Errorf("unrelated prompt went to %s (%s), want a backend with an empty tree", d.Candidates[0].ID, d.Reason)
	}
}
