package scrape

import (
	"strings"
	"testing"
)

func TestParseAlternatives(t *testing.T) {
	tests := []struct {
		in      string
		want    string // String() of the result
		wantErr string // substring
	}{
		{in: "", want: ""},
		{in: "   ", want: ""},
		{in: "vllm:num_requests_waiting", want: "vllm:num_requests_waiting"},
		{in: "nv_trt_llm_request_metrics{request_type=waiting}", want: `nv_trt_llm_request_metrics{request_type="waiting"}`},
		{in: `m{b="x y", a=1,}`, want: `m{a="1",b="x y"}`},
		{in: `m{a="q\"uote\\"}`, want: `m{a="q\"uote\\"}`},
		{in: `m{a=""}`, want: `m{a=""}`},
		{in: " a | b{x=1} ", want: `a | b{x="1"}`},
		{in: "m{}", want: "m"},
		{in: "1abc", wantErr: "must start with"},
		{in: "m{a}", wantErr: "expected ="},
		{in: "m{a=}", wantErr: "empty value"},
		{in: "m{a=1", wantErr: "missing }"},
		{in: `m{a="1}`, wantErr: "unterminated"},
		{in: "m{a=1,a=2}", wantErr: "given twice"},
		{in: "m{a=1 b=2}", wantErr: "expected , or }"},
		{in: "m x", wantErr: "separate alternatives"},
		{in: "a |", wantErr: "empty spec"},
		{in: "| a", wantErr: "empty spec"},
		{in: `m{a="\t"}`, wantErr: "unknown escape"},
	}
	for _, tt := range tests {
		got, err := ParseAlternatives(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAlternatives(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseAlternatives(%q): %v", tt.in, err)
			continue
		}
		if got.String() != tt.want {
			t.Errorf("ParseAlternatives(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// FuzzParseAlternatives: never panics, and what parses prints back to
// something that parses to the same thing.
func FuzzParseAlternatives(f *testing.F) {
	for _, s := range []string{"", "a", `m{a="1",b=2}`, "a | b", `m{a="\""}`, "m{", "x{y=}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		alts, err := ParseAlternatives(s)
		if err != nil {
			return
		}
		again, err := ParseAlternatives(alts.String())
		if err != nil {
			t.Fatalf("%q parsed, but its String %q does not: %v", s, alts.String(), err)
		}
		if again.String() != alts.String() {
			t.Fatalf("round trip %q -> %q -> %q", s, alts.String(), again.String())
		}
	})
}

// TestSpecStringRoundTrip: values with bytes Go's %q would escape as \x or
// \t print back in a form the parser reads (a bug the fuzzer found; its
// input is kept under testdata/fuzz).
func TestSpecStringRoundTrip(t *testing.T) {
	for _, in := range []string{"A{A=\xb6}", "m{a=\"tab\there\"}", "m{a=\"line\\nbreak\",b=\"q\\\"\"}", "m{a=é}"} {
		alts, err := ParseAlternatives(in)
		if err != nil {
			t.Fatalf("ParseAlternatives(%q): %v", in, err)
		}
		again, err := ParseAlternatives(alts.String())
		if err != nil || again.String() != alts.String() || again[0].Labels[0].Value != alts[0].Labels[0].Value {
			t.Errorf("%q -> %q -> %v, %v", in, alts.String(), again, err)
		}
	}
}
