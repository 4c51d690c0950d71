package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
)

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
	cfg, err := config.Load(path, env)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	fmt.Fprintf(stdout, "%s: ok (%d backends)\n", path, len(cfg.Backends))
	return nil
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
	cfg, err := config.Load(*path, env)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	return serve.Run(ctx, cfg, &serve.Source{Path: *path, Env: env}, stdout, stderr)
}
