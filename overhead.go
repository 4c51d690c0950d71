package main

import (
	"context"
	"io"
	"time"

	"github.com/llmlb/llmlb/overhead"
)

// cmdOverhead measures what llmlb adds to a request against a direct
// connection, Go's reverse proxy alone, HAProxy and nginx, in front of one
// fast emulated backend; with --go-proxy it is instead the go row's
// process.
func cmdOverhead(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("overhead", "llmlb overhead [--proxy direct,llmlb,go,haproxy,nginx] [--duration D] [--scale F] [--scenario S,...] [--json FILE] [--cpuprofile DIR] [--require] [--quiet] [--llmlb PATH]", stderr)
	var c overhead.Command
	proxies := fs.String("proxy", "direct,llmlb,go,haproxy,nginx", "comma-separated rows: direct, llmlb (this executable), llmlb-keyed (with an API key whose limits no load reaches and a session header per client), llmlb-redis (llmlb-keyed with cluster.redis on a redis-server it starts from PATH), llmlb-capture (llmlb with capture: of every request to a file of the run, which must get lines), go (Go's httputil.ReverseProxy alone, run by this executable), haproxy, nginx (from PATH or /usr/sbin)")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "how long each scenario runs against each proxy")
	fs.Float64Var(&c.Scale, "scale", 1, "share of the clients of the concurrent scenarios (64 requests, 8 long prompts, 150 long chats, 256 streams)")
	fs.BoolVar(&c.Require, "require", false, "fail when a proxy is not installed instead of skipping its row")
	fs.StringVar(&c.JSONFile, "json", "", "also write the results as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress lines")
	fs.StringVar(&c.LLMLB, "llmlb", "", "llmlb executable to measure (default: this one)")
	scenarios := fs.String("scenario", "", "comma-separated scenarios to run: latency, throughput, long-prompt, long-chat, streams (default: all)")
	fs.StringVar(&c.ProfileDir, "cpuprofile", "", "write llmlb's CPU profile of each scenario, from its admin pprof, to DIR/llmlb-<scenario>.pprof")
	goProxy := fs.String("go-proxy", "", "instead of measuring, serve as the go row's process: Go's httputil.ReverseProxy alone in front of this backend URL, until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *goProxy != "" {
		return overhead.ServeGoProxy(ctx, *goProxy, stdout)
	}
	c.Proxies, c.Scenarios = split(*proxies), split(*scenarios)
	c.Require = c.Require || getenv("LLMLB_REQUIRE_PROXIES") == "1"
	if !*quiet {
		c.Progress = stderr
	}
	return c.Run(ctx, stdout)
}
