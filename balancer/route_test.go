package balancer

import "testing"

func TestModelSplitWeights(t *testing.T) {
	b := newBal(t, "ttft")
	b.SetModels([]ModelRoute{{Name: "chat", Targets: []ModelTarget{{Model: "v1", Weight: 90}, {Model: "v2", Weight: 10}}, Priority: 2}})
	n := map[string]int{}
	for range 10000 {
		m, prio := b.Route("chat")
		n[m]++
		if prio != 2 {
			t.Fatalf("priority %d, want 2", prio)
		}
	}
	if share := float64(n["v1"]) / 100; share < 88 || share > 92 {
		t.Errorf("v1 got %.1f%% of 10000 picks, want 90±2", share)
	}
	if m, _ := b.Route("plain"); m != "plain" {
		t.Errorf("unrouted model resolved to %q", m)
	}
}
