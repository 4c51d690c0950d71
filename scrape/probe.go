package scrape

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// ProbeOptions say what [Probe] reads and with which engine row.
type ProbeOptions struct {
	// Source is a server's URL (http:// or https://), or the file of a
	// saved metrics page. A URL without a path is the server's: the
	// engine row's metrics path on it is read.
	Source string
	// Engine names the engine row to read the page with.
	Engine string
	// Engines are the config's overrides of the engine rows ([NewEngineSet]);
	// nil reads with the built-in rows.
	Engines map[string]EngineConfig
	// Timeout bounds each fetch of a URL (default 5s).
	Timeout time.Duration
}

// ProbeResult is what one page said, read with one engine row: what
// `llmlb probe` prints, and its --json object.
type ProbeResult struct {
	Engine    string             `json:"engine"`
	Source    string             `json:"source"` // the URL read, or the file
	Queued    balancer.Value     `json:"queued"`
	Running   balancer.Value     `json:"running"`
	KVUsage   balancer.Value     `json:"kv_usage"`
	BlockSize balancer.Value     `json:"block_size"`
	NumBlocks balancer.Value     `json:"num_blocks"`
	LoRA      *balancer.LoRAInfo `json:"lora"`
	// Missing names the signals the backend should have and the page
	// lacks ([Reading.MissingExpected]); never nil.
	Missing []string `json:"missing"`
	// Specs maps each signal read to the spec that matched it.
	Specs map[string]string `json:"specs"`
}

// NoSignalsError is [Probe]'s error for a page on which the engine row
// finds none of its signals, as when the server is another engine's.
// Probe returns its full result with it, every signal unknown.
type NoSignalsError struct {
	// Engine is the row that found nothing.
	Engine string
	// Matches are the other engine rows that read the most signals on
	// the page; none when no row reads any.
	Matches []string
}

func (e *NoSignalsError) Error() string {
	hint := "no known engine's metrics are on it either (is it a model server's metrics page?)"
	if len(e.Matches) > 0 {
		hint = fmt.Sprintf("its families match %s; try --engine %s", strings.Join(e.Matches, " and "), e.Matches[0])
	}
	return fmt.Sprintf("probe: the page has none of the %s engine's metrics, so every signal is unknown: %s", e.Engine, hint)
}

// Probe reads o.Source with the engine row o.Engine and returns what the
// balancer would read from it. LoRA information is expected of a saved
// page, but of a live server only when its /v1/models lists adapters. When
// the row finds no signal on the page, Probe reads it with every other row
// too and returns the result with a [*NoSignalsError] naming those that
// read it best.
func Probe(ctx context.Context, o ProbeOptions) (ProbeResult, error) {
	set, err := NewEngineSet(o.Engines)
	if err != nil {
		return ProbeResult{}, err
	}
	e := set[o.Engine]
	if e == nil {
		return ProbeResult{}, fmt.Errorf("probe: unknown engine %q (known: %s)", o.Engine, strings.Join(set.Names(), ", "))
	}
	o.Timeout = cmp.Or(o.Timeout, 5*time.Second)
	src := &probeSource{name: o.Source, timeout: o.Timeout, client: &http.Client{Transport: &http.Transport{Proxy: nil}}}
	src.live = strings.HasPrefix(o.Source, "http://") || strings.HasPrefix(o.Source, "https://")
	if !src.live {
		if src.page, err = os.ReadFile(o.Source); err != nil {
			return ProbeResult{}, fmt.Errorf("probe: %w", err)
		}
	}
	read, r, err := src.read(ctx, e)
	if err != nil {
		return ProbeResult{}, err
	}
	servesAdapters := true // a saved page cannot say
	if src.live {
		u, _ := url.Parse(read) // parsed by src.read
		if _, adapters, err := FetchModels(ctx, src.client, &url.URL{Scheme: u.Scheme, Host: u.Host}, o.Timeout); err == nil {
			servesAdapters = len(adapters) > 0
		}
	}
	res := ProbeResult{
		Engine: e.Name, Source: read,
		Queued: r.Metrics.Queued, Running: r.Metrics.Running, KVUsage: r.Metrics.KVUsage,
		BlockSize: r.Metrics.BlockSize, NumBlocks: r.Metrics.NumBlocks, LoRA: r.Metrics.LoRA,
		Missing: r.MissingExpected(servesAdapters), Specs: r.Used,
	}
	if res.Missing == nil {
		res.Missing = []string{}
	}
	if len(r.Used) == 0 {
		return res, &NoSignalsError{Engine: e.Name, Matches: src.matches(ctx, e.Name, set)}
	}
	return res, nil
}

// probeSource is the page [Probe] reads: a saved page, read once, or a
// server's URL, fetched at each read.
type probeSource struct {
	name    string
	live    bool
	page    []byte // the saved page; nil when live
	client  *http.Client
	timeout time.Duration
}

// read reads the source with engine row e and returns what it read: the
// file, or the URL, which for a bare server URL is e's own metrics path.
func (s *probeSource) read(ctx context.Context, e *Engine) (string, Reading, error) {
	if !s.live {
		r, err := e.Extract(s.page, time.Now())
		if err != nil {
			return s.name, r, fmt.Errorf("probe %s: %w", s.name, err)
		}
		return s.name, r, nil
	}
	u, err := url.Parse(s.name)
	if err != nil {
		return s.name, Reading{}, fmt.Errorf("probe: %w", err)
	}
	if u.Path == "" || u.Path == "/" {
		u = u.JoinPath(e.MetricsPath)
	}
	r, err := Fetch(ctx, s.client, u.String(), e, s.timeout)
	if err != nil {
		return u.String(), r, fmt.Errorf("probe: %w", err)
	}
	return u.String(), r, nil
}

// matches names the engine rows of set other than tried that read the
// most signals from the source, in name order.
func (s *probeSource) matches(ctx context.Context, tried string, set EngineSet) []string {
	var best []string
	most := 0
	for _, name := range set.Names() {
		if name == tried {
			continue
		}
		_, r, err := s.read(ctx, set[name])
		if err != nil || len(r.Used) == 0 {
			continue
		}
		switch n := len(r.Used); {
		case n > most:
			best, most = []string{name}, n
		case n == most:
			best = append(best, name)
		}
	}
	return best
}

// WriteJSON writes r as one indented JSON object.
func (r ProbeResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r as a table: a signal a line, with the spec that
// matched it, then the missing signals.
func (r ProbeResult) WriteText(w io.Writer) error {
	show := func(v balancer.Value) string {
		b, _ := v.MarshalJSON()
		if string(b) == "null" {
			return "unknown"
		}
		return string(b)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s read as %s\n\n", r.Source, r.Engine)
	for _, row := range []struct {
		name, value, signal string
	}{
		{"queued", show(r.Queued), SignalQueued},
		{"running", show(r.Running), SignalRunning},
		{"kv_usage", show(r.KVUsage), SignalKVUsage},
		{"block_size", show(r.BlockSize), SignalBlockSize},
		{"num_blocks", show(r.NumBlocks), SignalNumBlocks},
	} {
		fmt.Fprintf(&b, "  %-11s %-12s %s\n", row.name, row.value, r.Specs[row.signal])
	}
	if r.LoRA != nil {
		fmt.Fprintf(&b, "  %-11s max %d, running [%s], waiting [%s]  %s\n", "lora", r.LoRA.Max,
			strings.Join(r.LoRA.Running, ","), strings.Join(r.LoRA.Waiting, ","), r.Specs[SignalLoRA])
	} else {
		fmt.Fprintf(&b, "  %-11s unknown\n", "lora")
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(&b, "\nmissing: %s (the page has no series matching the engine row's spec)\n", strings.Join(r.Missing, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
