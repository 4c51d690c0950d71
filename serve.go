package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/scrape"
)

// cmdValidate checks a config file with [config.Check], the checks serve
// runs before it listens, and prints every problem or one ok line.
func cmdValidate(args []string, env config.Environ, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "llmlb validate [--config] PATH", stderr)
	configPath := fs.String("config", "", "config file (or give it as the argument; default config.yaml)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	path := *configPath
	switch {
	case fs.NArg() > 1 || fs.NArg() == 1 && path != "":
		fs.Usage()
		return errors.New("validate takes one config file, as --config PATH or as PATH")
	case fs.NArg() == 1:
		path = fs.Arg(0)
	case path == "":
		path = "config.yaml"
	}
	cfg, err := config.Check(path, env)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	fmt.Fprintf(stdout, "%s: ok (%s)\n", path, countBackends(cfg.Backends))
	return nil
}

// countBackends says what `backends:` holds: "1 backend", "3 backends",
// "2 DNS discovery entries", or both. A DNS or SRV entry stands for as
// many backends as its name resolves to, which validate does not ask.
func countBackends(entries []scrape.BackendConfig) string {
	static := 0
	for _, e := range entries {
		if e.URL != "" {
			static++
		}
	}
	var parts []string
	if static > 0 {
		parts = append(parts, plural(static, "backend", "backends"))
	}
	if n := len(entries) - static; n > 0 {
		parts = append(parts, plural(n, "DNS discovery entry", "DNS discovery entries"))
	}
	return strings.Join(parts, ", ")
}

// plural is n with the noun that fits it.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func cmdServe(ctx context.Context, args []string, env config.Environ, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "llmlb serve [--config PATH]", stderr)
	path := fs.String("config", "config.yaml", "config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Check(*path, env) // what validate runs: every problem at once, files included
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	return serve.Run(ctx, cfg, &serve.Source{Path: *path, Env: env}, stdout, stderr)
}
