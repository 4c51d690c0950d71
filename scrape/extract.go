package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmlb/llmlb/balancer"
)

// ErrNoData is returned for a metrics page with no samples at all: an empty
// 200 answer means the server has nothing to say, not that every count is 0.
var ErrNoData = errors.New("metrics page has no samples")

// Reading is what one metrics page said, signal by signal.
type Reading struct {
	Metrics balancer.Metrics
	// Missing names the signals the engine row asks for that the page does
	// not have (see the Signal constants), sorted.
	Missing []string
	// Used maps each signal found to the spec that matched it, which tells
	// which alternative was read.
	Used map[string]string
	// Ranks holds each data-parallel rank's own metrics, by global rank,
	// when the page labels its series with ranks (see
	// [Engine.RankLabel]); nil when it does not. Metrics is then the
	// whole server's: counts summed, fractions averaged over the ranks.
	Ranks map[int]balancer.Metrics
}

// MissingExpected returns the signals of r.Missing that the backend should
// have. LoRA information is expected only from a backend that serves
// adapters: vLLM registers vllm:lora_requests_info only when LoRA is
// enabled, so a server without adapters lacks it by design, and a warning
// about it would teach operators to ignore the one that catches a wrong
// engine (issue 18).
func (r Reading) MissingExpected(servesAdapters bool) []string {
	if servesAdapters || !slices.Contains(r.Missing, SignalLoRA) {
		return r.Missing
	}
	return slices.DeleteFunc(slices.Clone(r.Missing), func(s string) bool { return s == SignalLoRA })
}

// Extract reads e's signals from a Prometheus text page. Families e does not
// name are dropped line by line before the page is parsed, so a page of
// thousands of histogram buckets costs a scan, not a parse, and a malformed
// line in a family we do not read does not spoil the page. Histogram and
// summary families are never read as gauges. at is recorded as the reading
// time.
func (e *Engine) Extract(page []byte, at time.Time) (Reading, error) {
	fams, err := e.parse(page)
	if err != nil {
		return Reading{}, err
	}
	r := e.read(fams, at, nil)
	e.readRanks(fams, e.pageRanks(fams), &r)
	return r, nil
}

// parse filters page to e's families (see [Engine.Extract]) and parses it.
func (e *Engine) parse(page []byte) (map[string]*dto.MetricFamily, error) {
	if !hasSample(page) {
		return nil, ErrNoData
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(e.filter(page)))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// read reads e's signals from parsed families, from the series keep
// accepts (every series when keep is nil).
func (e *Engine) read(fams map[string]*dto.MetricFamily, at time.Time, keep func(*dto.Metric) bool) Reading {
	r := Reading{Metrics: balancer.Metrics{At: at}, Used: map[string]string{}}
	match := func(s Spec) []*dto.Metric {
		ms := matching(fams, s)
		if keep != nil {
			ms = slices.DeleteFunc(ms, func(m *dto.Metric) bool { return !keep(m) })
		}
		return ms
	}
	for _, sig := range e.numericSignals() {
		if len(sig.alts) == 0 {
			continue
		}
		found := false
		for _, s := range sig.alts {
			if v, ok := aggregate(match(s), sig.label, sig.fold); ok {
				*sig.field(&r.Metrics) = v
				r.Used[sig.name] = s.String()
				found = true
				break
			}
		}
		if !found {
			r.Missing = append(r.Missing, sig.name)
		}
	}
	if len(e.LoRA) > 0 {
		for _, s := range e.LoRA {
			if series := match(s); len(series) > 0 {
				r.Metrics.LoRA = newestLoRA(series)
				r.Used[SignalLoRA] = s.String()
				break
			}
		}
		if r.Metrics.LoRA == nil {
			r.Missing = append(r.Missing, SignalLoRA)
		}
	}
	slices.Sort(r.Missing)
	return r
}

// filter keeps the lines of page that belong to families e reads: their
// HELP and TYPE lines and samples whose metric name is exactly a needed
// name. A needed histogram's _bucket, _sum and _count lines are dropped,
// since their names differ.
func (e *Engine) filter(page []byte) []byte {
	out := make([]byte, 0, 4<<10)
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		t := bytes.TrimLeft(line, " \t")
		var name []byte
		if len(t) > 0 && t[0] == '#' {
			f := bytes.Fields(t[1:])
			if len(f) < 2 || (string(f[0]) != "HELP" && string(f[0]) != "TYPE") {
				continue
			}
			name = f[1]
		} else {
			name = t[:nameLen(string(t))] // metric names are ASCII
		}
		if len(name) == 0 || !e.needed[string(name)] {
			continue
		}
		out = append(out, line...)
		if line[len(line)-1] != '\n' {
			out = append(out, '\n')
		}
	}
	return out
}

// hasSample reports whether page has at least one line that is not blank
// and not a comment.
func hasSample(page []byte) bool {
	found := false
	sampleLines(page, func([]byte) bool { found = true; return false })
	return found
}

// sampleLines calls f with each line of page that is not blank and not a
// comment, spaces trimmed, until f returns false.
func sampleLines(page []byte, f func(line []byte) bool) {
	for line := range bytes.Lines(page) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		if !f(line) {
			return
		}
	}
}

// matching returns the series of s's family that carry s's labels. Series of
// histogram and summary families are never returned.
func matching(fams map[string]*dto.MetricFamily, s Spec) []*dto.Metric {
	f := fams[s.Name]
	if f == nil {
		return nil
	}
	switch f.GetType() {
	case dto.MetricType_GAUGE, dto.MetricType_COUNTER, dto.MetricType_UNTYPED:
	default:
		return nil
	}
	var out []*dto.Metric
	for _, m := range f.GetMetric() {
		if s.matches(m) {
			out = append(out, m)
		}
	}
	return out
}

// sampleValue returns a gauge, counter or untyped sample's value, if finite.
func sampleValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func sum(vs []float64) float64 {
	t := 0.0
	for _, v := range vs {
		t += v
	}
	return t
}

func mean(vs []float64) float64 { return sum(vs) / float64(len(vs)) }

// aggregate folds the series' values, or the numeric value of their label
// when label is set (an info gauge such as vllm:cache_config_info). Series
// with no usable value ("None", NaN) are skipped; none left is unknown.
func aggregate(ms []*dto.Metric, label string, fold func([]float64) float64) (balancer.Value, bool) {
	vs := make([]float64, 0, len(ms))
	for _, m := range ms {
		if label == "" {
			if v, ok := sampleValue(m); ok {
				vs = append(vs, v)
			}
			continue
		}
		if v, err := strconv.ParseFloat(labelValue(m, label), 64); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return balancer.Value{}, false
	}
	return balancer.Known(fold(vs)), true
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// newestLoRA picks the LoRA info series with the newest value (vLLM sets it
// to the time of the update, and old label sets linger as stale series).
// Several series can share the newest value; then the one with more running
// adapters wins, then more waiting ones, then the greatest label values in
// byte order, so that the choice never depends on the order of lines on the
// page.
func newestLoRA(ms []*dto.Metric) *balancer.LoRAInfo {
	var best *dto.Metric
	var bestV float64
	for _, m := range ms {
		v, ok := sampleValue(m)
		if !ok {
			continue
		}
		if best == nil || v > bestV || (v == bestV && loraLess(best, m)) {
			best, bestV = m, v
		}
	}
	if best == nil {
		return nil
	}
	info := &balancer.LoRAInfo{
		Running: splitAdapters(labelValue(best, "running_lora_adapters")),
		Waiting: splitAdapters(labelValue(best, "waiting_lora_adapters")),
	}
	if n, err := strconv.Atoi(labelValue(best, "max_lora")); err == nil && n >= 0 {
		info.Max = n
	}
	return info
}

// loraLess orders two series that share the newest value.
func loraLess(a, b *dto.Metric) bool {
	ra, rb := splitAdapters(labelValue(a, "running_lora_adapters")), splitAdapters(labelValue(b, "running_lora_adapters"))
	if len(ra) != len(rb) {
		return len(ra) < len(rb)
	}
	wa, wb := splitAdapters(labelValue(a, "waiting_lora_adapters")), splitAdapters(labelValue(b, "waiting_lora_adapters"))
	if len(wa) != len(wb) {
		return len(wa) < len(wb)
	}
	for _, l := range []string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"} {
		if c := strings.Compare(labelValue(a, l), labelValue(b, l)); c != 0 {
			return c < 0
		}
	}
	return false
}

// splitAdapters splits a comma-separated adapter list, dropping blanks.
func splitAdapters(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
