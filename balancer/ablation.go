package balancer

import (
	"fmt"
	"strings"
)

// Rules is a set of the ttft policy's rules that an ablation turns off
// ([Config.Without]), so that a benchmark can show what each one earns
// (issue 46). The zero value turns none off, as serve runs it.
type Rules uint32

// The rules, one bit each; [ruleNames] holds their names in this order.
const (
	ruleCopyMargin    Rules = 1 << iota // a copy must beat the holder by CopyMargin
	ruleBacklogCopy                     // no copy onto a backend with a backlog
	ruleColdPlace                       // cold prompts by rendezvous among the fast ([TTFTPicker.place])
	ruleConversations                   // conversation homes
	ruleEvicted                         // an evicted prompt counts every class as fast
	ruleColdRoom                        // ColdRoom
	ruleClassTime                       // place reads a hardware class's mean time
	ruleWarmTie                         // TieTolerance
	ruleMiss                            // MissWeight
	ruleMissQueued                      // the miss cost's step×queued
	ruleMissArrivals                    // the miss cost's uncached×ρ/(1−ρ)
	ruleKVPenalty                       // KVPenalty
	ruleDecode                          // DecodeCost
	ruleKeepHolders                     // saturated holders stay candidates (KeepHolders)
	ruleHolderQueue                     // the bound on a saturated holder's queue (HolderQueue)
	ruleSaturation                      // saturation.queue and saturation.kv
	ruleSlots                           // slot-full candidates dropped (Balancer.full)
	ruleLoadBound                       // the bound on one backend's requests in flight (LoadFactor)
	ruleCopyBatch                       // a copy must beat the holder without the decode slowdown
)

var ruleNames = [...]string{
	"copy-margin", "backlog-copy", "cold-place", "conversations", "evicted", "cold-room", "class-time",
	"warm-tie", "miss", "miss-queued", "miss-arrivals", "kv-penalty", "decode",
	"keep-holders", "holder-queue", "saturation", "slots", "load-bound", "copy-batch",
}

// RuleNames returns the names [ParseRules] reads, one a rule.
func RuleNames() []string { return ruleNames[:] }

// ParseRules reads a "+"-separated list of rule names.
func ParseRules(s string) (Rules, error) {
	var r Rules
	for name := range strings.SplitSeq(s, "+") {
		i := 0
		for i < len(ruleNames) && ruleNames[i] != name {
			i++
		}
		if i == len(ruleNames) {
			return 0, fmt.Errorf("unknown rule %q (known: %s)", name, strings.Join(ruleNames[:], ", "))
		}
		r |= 1 << i
	}
	return r, nil
}

// has reports whether r holds any of x.
func (r Rules) has(x Rules) bool { return r&x != 0 }

// Without returns c with the rules off turned off: by the knob that
// already does it where there is one (ColdRoom, TieTolerance, MissWeight,
// KVPenalty, DecodeCost and the saturation fields), else
// by [TTFTConfig.Off], which the scorer and picker consult where the
// rule lives. It records every rule in Off, so the config says what
// was ablated.
func (c Config) Without(off Rules) Config {
	t, s := &c.TTFT, &c.Saturation
	t.Off |= off
	if off.has(ruleColdRoom) {
		t.ColdRoom = 0
	}
	if off.has(ruleWarmTie) {
		t.TieTolerance = 0
	}
	if off.has(ruleMiss) {
		t.MissWeight = 0
	}
	if off.has(ruleKVPenalty) {
		t.KVPenalty = 0
	}
	if off.has(ruleDecode) {
		t.DecodeCost = 0
	}
	if off.has(ruleKeepHolders) {
		s.KeepHolders = false
	}
	if off.has(ruleHolderQueue) {
		s.HolderQueue = 0
	}
	if off.has(ruleSaturation) {
		s.Queue, s.KV = 0, 0
	}
	if off.has(ruleLoadBound) {
		s.LoadFactor = 0
	}
	return c
}
