package main

import (
	"cmp"
	"context"
	"errors"
	"io"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/scrape"
)

// cmdProbe prints what the balancer reads from a server's or a saved metrics page.
func cmdProbe(ctx context.Context, args []string, env config.Environ, stdout, stderr io.Writer) error {
	fs := newFlagSet("probe", "llmlb probe [--engine E] [--config PATH] [--json] URL|FILE", stderr)
	var o scrape.ProbeOptions
	fs.StringVar(&o.Engine, "engine", "vllm", "engine row to read the page with")
	configPath := fs.String("config", "", "config file whose engines: section applies (optional)")
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Second, "timeout for fetching a URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("probe takes one URL or file")
	}
	if *configPath != "" {
		cfg, err := config.Load(*configPath, env)
		if err != nil {
			return err
		}
		o.Engines = cfg.Engines
	}
	o.Source = fs.Arg(0)
	res, err := scrape.Probe(ctx, o)
	if _, none := errors.AsType[*scrape.NoSignalsError](err); err != nil && !none {
		return err
	}
	if *asJSON {
		return cmp.Or(res.WriteJSON(stdout), err)
	}
	return cmp.Or(res.WriteText(stdout), err) // a page without signals is shown, then fails
}
