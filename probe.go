package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/scrape"
)

// probeResult is what `llmlb probe --json` prints.
type probeResult struct {
	Engine    string             `json:"engine"`
	Source    string             `json:"source"`
	Queued    balancer.Value     `json:"queued"`
	Running   balancer.Value     `json:"running"`
	KVUsage   balancer.Value     `json:"kv_usage"`
	BlockSize balancer.Value     `json:"block_size"`
	NumBlocks balancer.Value     `json:"num_blocks"`
	LoRA      *balancer.LoRAInfo `json:"lora"`
	Missing   []string           `json:"missing"`
	Specs     map[string]string  `json:"specs"`
}

// cmdProbe scrapes a live server, or reads a saved page, with an engine row
// and prints what the balancer would read.
func cmdProbe(ctx context.Context, args []string, env config.Environ, stdout, stderr io.Writer) error {
	fs := newFlagSet("probe", "llmlb probe [--engine E] [--config PATH] [--json] URL|FILE", stderr)
	engine := fs.String("engine", "vllm", "engine row to read the page with")
	configPath := fs.String("config", "", "config file whose engines: section applies (optional)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout for fetching a URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("probe takes one URL or file")
	}
	var overrides map[string]scrape.EngineConfig
	if *configPath != "" {
		cfg, err := config.Load(*configPath, env)
		if err != nil {
			return err
		}
		overrides = cfg.Engines
	}
	set, err := scrape.NewEngineSet(overrides)
	if err != nil {
		return err
	}
	e := set[*engine]
	if e == nil {
		return fmt.Errorf("probe: unknown engine %q (known: %s)", *engine, strings.Join(set.Names(), ", "))
	}
	src := fs.Arg(0)
	live := strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://")
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	var page []byte // a saved page, read once
	if !live {
		if page, err = os.ReadFile(src); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	// read reads the source with engine row e; for a bare server URL it
	// fetches e's own metrics path.
	read := func(e *scrape.Engine) (string, scrape.Reading, error) {
		if !live {
			r, err := e.Extract(page, time.Now())
			if err != nil {
				return src, r, fmt.Errorf("probe %s: %w", src, err)
			}
			return src, r, nil
		}
		u, err := url.Parse(src)
		if err != nil {
			return src, scrape.Reading{}, fmt.Errorf("probe: %w", err)
		}
		if u.Path == "" || u.Path == "/" {
			u = u.JoinPath(e.MetricsPath)
		}
		r, err := scrape.Fetch(ctx, client, u.String(), e, *timeout)
		if err != nil {
			return u.String(), r, fmt.Errorf("probe: %w", err)
		}
		return u.String(), r, nil
	}
	src, r, err := read(e)
	if err != nil {
		return err
	}
	// A live server says whether it serves adapters; only then is LoRA
	// information expected of it. A saved page cannot say.
	servesAdapters := true
	if live {
		u, _ := url.Parse(src) // parsed by read
		if _, adapters, err := scrape.FetchModels(ctx, client, &url.URL{Scheme: u.Scheme, Host: u.Host}, *timeout); err == nil {
			servesAdapters = len(adapters) > 0
		}
	}
	r.Missing = r.MissingExpected(servesAdapters)
	var wrongEngine error
	if len(r.Used) == 0 {
		wrongEngine = fmt.Errorf("probe: the page has none of the %s engine's metrics, so every signal is unknown: %s", e.Name, suggestEngine(e.Name, set, read))
	}
	res := probeResult{
		Engine: e.Name, Source: src,
		Queued: r.Metrics.Queued, Running: r.Metrics.Running, KVUsage: r.Metrics.KVUsage,
		BlockSize: r.Metrics.BlockSize, NumBlocks: r.Metrics.NumBlocks, LoRA: r.Metrics.LoRA,
		Missing: r.Missing, Specs: r.Used,
	}
	if res.Missing == nil {
		res.Missing = []string{}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
		return wrongEngine
	}
	show := func(v balancer.Value) string {
		b, _ := v.MarshalJSON()
		if string(b) == "null" {
			return "unknown"
		}
		return string(b)
	}
	fmt.Fprintf(stdout, "%s read as %s\n\n", src, e.Name)
	for _, row := range []struct {
		name, value, signal string
	}{
		{"queued", show(res.Queued), scrape.SignalQueued},
		{"running", show(res.Running), scrape.SignalRunning},
		{"kv_usage", show(res.KVUsage), scrape.SignalKVUsage},
		{"block_size", show(res.BlockSize), scrape.SignalBlockSize},
		{"num_blocks", show(res.NumBlocks), scrape.SignalNumBlocks},
	} {
		fmt.Fprintf(stdout, "  %-11s %-12s %s\n", row.name, row.value, res.Specs[row.signal])
	}
	if res.LoRA != nil {
		fmt.Fprintf(stdout, "  %-11s max %d, running [%s], waiting [%s]  %s\n", "lora", res.LoRA.Max,
			strings.Join(res.LoRA.Running, ","), strings.Join(res.LoRA.Waiting, ","), res.Specs[scrape.SignalLoRA])
	} else {
		fmt.Fprintf(stdout, "  %-11s unknown\n", "lora")
	}
	if len(res.Missing) > 0 {
		fmt.Fprintf(stdout, "\nmissing: %s (the page has no series matching the engine row's spec)\n", strings.Join(res.Missing, ", "))
	}
	return wrongEngine
}

// suggestEngine names the engine rows whose families the page has, best
// first, for a page that the requested row found nothing on.
func suggestEngine(tried string, set scrape.EngineSet, read func(*scrape.Engine) (string, scrape.Reading, error)) string {
	var best []string
	most := 0
	for _, name := range set.Names() {
		if name == tried {
			continue
		}
		_, r, err := read(set[name])
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
	if len(best) == 0 {
		return "no known engine's metrics are on it either (is it a model server's metrics page?)"
	}
	return fmt.Sprintf("its families match %s; try --engine %s", strings.Join(best, " and "), best[0])
}
