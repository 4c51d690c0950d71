package main

import (
	"context"
	"io"
	"time"

	"github.com/llmlb/llmlb/internal/demo"
)

// cmdDemo runs emulated servers, the balancer and streaming clients with a
// live per-backend view.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "llmlb demo [--backends N] [--duration D] [--concurrency C] [--speed X] [--status ADDR]", stderr)
	var o demo.Options
	fs.IntVar(&o.Backends, "backends", 4, "emulated servers (h100-8b engine model); the last one is the slower a100-8b")
	fs.DurationVar(&o.Duration, "duration", 20*time.Second, "how long to send traffic")
	fs.IntVar(&o.Concurrency, "concurrency", 24, "concurrent clients")
	fs.Float64Var(&o.Speed, "speed", 1, "run the emulated servers this many times faster than real time")
	fs.StringVar(&o.Status, "status", demo.DefaultStatus, "address of the admin status page (host:port; port 0 picks a free one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return demo.Run(ctx, o, stdout, stderr)
}
