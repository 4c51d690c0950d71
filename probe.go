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
func cmdProbe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("probe", "llmlb probe [--engine E] [--config PATH] [--json] URL|FILE", stderr)
	engine := fs.String("engine", "vllm", "engine row to read the page with")
	config := fs.String("config", "", "config file whose engines: section applies (optional)")
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
	if *config != "" {
		cfg, err := loadConfig(*config, getenv)
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
	var r scrape.Reading
	if strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://") {
		u, err := url.Parse(src)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		if u.Path == "" || u.Path == "/" {
			u = u.JoinPath(e.MetricsPath)
		}
		src = u.String()
		client := &http.Client{Transport: &http.Transport{Proxy: nil}}
		r, err = scrape.Fetch(ctx, client, src, e, *timeout)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	} else {
		page, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		r, err = e.Extract(page, time.Now())
		if err != nil {
			return fmt.Errorf("probe %s: %w", src, err)
		}
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
		return enc.Encode(res)
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
	return nil
}
