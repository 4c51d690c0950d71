package proxy

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// The deadline headers: llm-d's (the Inference Extension's router reads
// x-slo-ttft-ms and x-slo-tpot-ms, llm-d/llm-d-router
// pkg/epp/framework/plugins/flowcontrol/ordering/slodeadline at 0f255d70
// and its SLO scorer) and SGLang's router's (x-sgl-ttft-slo-ms, and
// x-sgl-tps-slo in tokens per second, sgl-project's router at the
// commits issue 56 names), read alike.
const (
	headerSLOTTFT    = "X-Slo-Ttft-Ms"
	headerSLOTPOT    = "X-Slo-Tpot-Ms"
	headerSGLangTTFT = "X-Sgl-Ttft-Slo-Ms"
	headerSGLangTPS  = "X-Sgl-Tps-Slo"
)

// maxDeadline bounds a deadline header, as config's are bounded.
const maxDeadline = balancer.MaxDeadline

// deadlines are a request's latency targets; 0 is none.
type deadlines struct {
	ttft, tpot time.Duration
}

// readDeadlines reads the deadline headers of r: a whole number of
// milliseconds above 0 (SGLang's tokens per second: a number above 0),
// else a 400 that names the header.
func readDeadlines(h http.Header) (deadlines, error) {
	var d deadlines
	for _, name := range []string{headerSLOTTFT, headerSGLangTTFT, headerSLOTPOT} {
		v := h.Get(name)
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		// Compared in milliseconds: a larger count in nanoseconds would
		// wrap past int64 to a negative deadline.
		if err != nil || ms <= 0 || ms > maxDeadline.Milliseconds() {
			return deadlines{}, badRequest("", "The %s header must be a whole number of milliseconds from 1 to %d, got %s.", strings.ToLower(name), maxDeadline.Milliseconds(), quote(v))
		}
		switch name {
		case headerSLOTPOT:
			d.tpot = time.Duration(ms) * time.Millisecond
		default:
			if d.ttft == 0 {
				d.ttft = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if v := h.Get(headerSGLangTPS); v != "" {
		tps, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(tps) || math.IsInf(tps, 0) || tps*maxDeadline.Seconds() < 1 || tps > 1e9 {
			return deadlines{}, badRequest("", "The %s header must be a number of tokens per second, at least one a day, got %s.", strings.ToLower(headerSGLangTPS), quote(v))
		}
		if d.tpot == 0 {
			d.tpot = max(time.Duration(float64(time.Second)/tps), time.Nanosecond)
		}
	}
	return d, nil
}
