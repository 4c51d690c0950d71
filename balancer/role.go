package balancer

import "fmt"

// Role is the part of a disaggregated prefill/decode (P/D) fleet a backend
// plays: it prefills prompts and hands their KV cache on, decodes prompts
// prefilled elsewhere, or does both, as every server of an aggregated
// fleet does. The zero value is [RoleBoth], so a fleet that declares no
// roles routes as it always did.
type Role int

const (
	// RoleBoth is a backend that prefills and decodes (the default).
	RoleBoth Role = iota
	// RolePrefill is a backend that only prefills (vLLM's kv_producer side
	// of a KV connector, SGLang's --disaggregation-mode prefill): it takes
	// only the prefill leg of a P/D request.
	RolePrefill
	// RoleDecode is a backend that decodes what a prefill server computed
	// (SGLang's --disaggregation-mode decode); it also takes requests too
	// short to be worth a prefill leg, and prefills those itself.
	RoleDecode
)

var roleNames = [...]string{RoleBoth: "both", RolePrefill: "prefill", RoleDecode: "decode"}

// String returns the role's name as config.yaml writes it.
func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// MarshalText writes r as its name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a name MarshalText wrote.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	*r = v
	return err
}

// ParseRole reads a role's name; "" is [RoleBoth].
func ParseRole(s string) (Role, error) {
	if s == "" {
		return RoleBoth, nil
	}
	for r, n := range roleNames {
		if n == s {
			return Role(r), nil
		}
	}
	return RoleBoth, fmt.Errorf("unknown role %q (known: prefill, decode, both)", s)
}

// takes reports whether a backend of role r may take a pick that asks for
// role want. A prefill pick needs a backend that prefills; any other pick
// (a decode leg, or a whole request answered by one backend) needs one
// that decodes, so a prefill-only server never answers a client itself.
func (r Role) takes(want Role) bool {
	if want == RolePrefill {
		return r != RoleDecode
	}
	return r != RolePrefill
}

// PDConfig is `balancer.pd:`, when a request on a fleet with prefill
// servers is split into a prefill leg and a decode leg.
type PDConfig struct {
	// MinUncachedTokens is the fewest prompt tokens the chosen decode
	// server lacks in its prefix cache for a request to take a prefill
	// leg; shorter or mostly cached prompts are prefilled by the decode
	// server itself, where a KV transfer would cost more than it saves.
	// This is llm-d's nonCachedTokens rule (prefix_based_pd_decider.go
	// in llm-d-inference-scheduler at 278a3e44, where 0 also splits
	// every request), with vLLM router's pd_uncached_token_threshold,
	// 256, as the default. (default 256)
	MinUncachedTokens int `mapstructure:"min_uncached_tokens"`
}

// Disaggregated reports whether a backend serving model has a declared
// role (prefill or decode): only then may a request take a prefill leg.
// A fleet of [RoleBoth] backends answers every request in one leg, as
// before roles existed.
func (s *Snapshot) Disaggregated(model string) bool {
	for _, be := range s.Backends {
		if be.Role != RoleBoth && be.Serves(model) {
			return true
		}
	}
	return false
}
