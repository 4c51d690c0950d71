package proxy

import (
	"net/http"
	"testing"
	"time"
)

func TestReadDeadlines(t *testing.T) {
	for _, tt := range []struct {
		h          map[string]string
		ttft, tpot time.Duration
		bad        bool
	}{
		{h: map[string]string{}},
		{h: map[string]string{"x-slo-ttft-ms": "500", "x-slo-tpot-ms": " 40 "}, ttft: 500 * time.Millisecond, tpot: 40 * time.Millisecond},
		{h: map[string]string{"x-sgl-ttft-slo-ms": "250", "x-sgl-tps-slo": "50"}, ttft: 250 * time.Millisecond, tpot: 20 * time.Millisecond},
		{h: map[string]string{"x-slo-ttft-ms": "100", "x-sgl-ttft-slo-ms": "900"}, ttft: 100 * time.Millisecond}, // llm-d's first
		{h: map[string]string{"x-slo-ttft-ms": "86400000"}, ttft: 24 * time.Hour},
		{h: map[string]string{"x-slo-ttft-ms": "86400001"}, bad: true},
		{h: map[string]string{"x-slo-ttft-ms": "10000000000000"}, bad: true}, // past int64 nanoseconds: wrapped negative
		{h: map[string]string{"x-slo-ttft-ms": "0"}, bad: true},
		{h: map[string]string{"x-slo-ttft-ms": "1e3"}, bad: true},
		{h: map[string]string{"x-sgl-tps-slo": "-1"}, bad: true},
		{h: map[string]string{"x-sgl-tps-slo": "Inf"}, bad: true},
		{h: map[string]string{"x-sgl-tps-slo": "0.00001"}, bad: true}, // a token every 28 hours
		{h: map[string]string{"x-sgl-tps-slo": "0.0001"}, tpot: 10000 * time.Second},
	} {
		h := http.Header{}
		for k, v := range tt.h {
			h.Set(k, v)
		}
		d, err := readDeadlines(h)
		if (err != nil) != tt.bad || d.ttft != tt.ttft || d.tpot != tt.tpot {
			t.Errorf("%v: %+v, %v; want ttft %s tpot %s bad %v", tt.h, d, err, tt.ttft, tt.tpot, tt.bad)
		}
	}
}

// FuzzReadDeadlines: whatever a client sends, a deadline read is within
// its bounds, or the request gets a 400.
func FuzzReadDeadlines(f *testing.F) {
	f.Add("500", "40", "", "")
	f.Add("", "", "250", "50")
	f.Add("0", "-1", "1e9", "NaN")
	f.Fuzz(func(t *testing.T, ttft, tpot, sglTTFT, tps string) {
		h := http.Header{}
		for k, v := range map[string]string{headerSLOTTFT: ttft, headerSLOTPOT: tpot, headerSGLangTTFT: sglTTFT, headerSGLangTPS: tps} {
			if v != "" {
				h.Set(k, v)
			}
		}
		d, err := readDeadlines(h)
		if err != nil {
			if he, ok := err.(*HTTPError); !ok || he.Status != http.StatusBadRequest {
				t.Fatalf("error %v is not a 400", err)
			}
			return
		}
		if d.ttft < 0 || d.ttft > maxDeadline || d.tpot < 0 || d.tpot > maxDeadline {
			t.Fatalf("%+v out of bounds", d)
		}
	})
}
