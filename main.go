package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if err != nil {
		if !errors.Is(err, errReported) && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "llmlb:", err)
		}
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(1)
	}
}

// errReported is returned when the problem was already printed in full.
var errReported = errors.New("reported")

// command is one subcommand as the help describes it.
type command struct {
	name    string
	summary string // its line in the command list
	about   string // the first line of its --help: a sentence saying what it does
	example string // a command line that works as written
}

// commands lists the subcommands in the order the help shows them.
func commands() []command {
	return []command{
		{"serve", "run the balancer in front of the servers a config file lists",
			"Serve runs the balancer: it routes OpenAI-style requests to the model servers listed in the config file, until SIGINT or SIGTERM.",
			"llmlb serve --config config.yaml"},
		{"validate", "check a config file and list every problem in it",
			"Validate checks a config file as serve would load it and lists every problem, each with its key; it exits 0 and prints ok when there is none.",
			"llmlb validate --config config.yaml"},
		{"probe", "show what the balancer reads from a server's metrics page",
			"Probe reads a model server's metrics page (a URL, or a saved file) with an engine's row and shows each signal the balancer would use.",
			"llmlb probe --engine vllm http://127.0.0.1:8001"},
		{"sim", "run emulated model servers (vLLM, SGLang, Triton, trtllm-serve)",
			"Sim runs emulated model servers that speak the OpenAI API and render their engine's /metrics, for trying llmlb without a GPU.",
			"llmlb sim --count 3 --listen 127.0.0.1:8001"},
		{"demo", "emulated servers, the balancer, traffic and a live view",
			"Demo runs emulated servers, the balancer and streaming clients in one process and shows each backend's load live.",
			"llmlb demo --duration 30s"},
		{"bench", "replay workloads through every routing policy in virtual time",
			"Bench replays workloads through each routing policy on the same emulated cluster in virtual time and prints one table per workload.",
			"llmlb bench --workload shared-prefix --policy default,round-robin"},
		{"overhead", "what llmlb adds per request, against HAProxy and nginx",
			"Overhead measures what llmlb adds per request, against a direct connection, HAProxy and nginx in front of one fast emulated backend.",
			"llmlb overhead --proxy direct,llmlb --duration 5s"},
		{"hash-key", "print the hash of an API key, for auth.keys or admin.token",
			"Hash-key reads an API key from standard input (or its argument, which leaves the key in the shell's history) and prints the line that stands for it in the config file: its SHA-256 as auth.keys[].key or admin.token hold it.",
			"llmlb hash-key < key.txt"},
		{"version", "print the version and build information",
			"Version prints llmlb's version and how it was built.",
			"llmlb version"},
		{"help", "print this list", "Help lists the commands.", "llmlb help"},
	}
}

// usage is the command list `llmlb`, `llmlb help` and `llmlb --help` print.
func usage() string {
	var b strings.Builder
	b.WriteString("llmlb is a load balancer for LLM inference servers (vLLM, SGLang, Triton TensorRT-LLM, trtllm-serve).\n\n")
	b.WriteString("Usage:\n\n\tllmlb COMMAND [flags]\n\nCommands:\n\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "\t%-9s %s\n", c.name, c.summary)
	}
	b.WriteString("\n`llmlb --config PATH` is short for `llmlb serve --config PATH`.\n")
	b.WriteString("Run 'llmlb COMMAND --help' for what a command does, an example and its flags.\n")
	return b.String()
}

// run is the whole program: main only supplies the process's arguments,
// environment and streams. SIGINT and SIGTERM end it gracefully.
func run(ctx context.Context, args []string, env config.Environ, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(args) == 0 {
		fmt.Fprint(stdout, usage())
		return nil
	}
	cmd := "serve" // flags without a command: serve's, as before commands existed
	switch args[0] {
	case "-h", "-help", "--help":
		cmd, args = "help", args[1:]
	case "-version", "--version":
		cmd, args = "version", args[1:]
	default:
		if !strings.HasPrefix(args[0], "-") {
			cmd, args = args[0], args[1:]
		}
	}
	switch cmd {
	case "serve":
		return cmdServe(ctx, args, env, stdout, stderr)
	case "validate":
		return cmdValidate(args, env, stdout, stderr)
	case "sim":
		return cmdSim(ctx, args, stdout, stderr)
	case "probe":
		return cmdProbe(ctx, args, env, stdout, stderr)
	case "demo":
		return cmdDemo(ctx, args, stdout, stderr)
	case "bench":
		return cmdBench(ctx, args, stdout, stderr)
	case "overhead":
		return cmdOverhead(ctx, args, env.Get, stdout, stderr)
	case "hash-key":
		return cmdHashKey(args, os.Stdin, stdout, stderr)
	case "version":
		return cmdVersion(args, stdout, stderr)
	case "help":
		return cmdHelp(args, stdout, stderr)
	}
	fmt.Fprint(stderr, usage())
	return fmt.Errorf("unknown command %q", cmd)
}

// cmdHelp prints the command list, or with a command name that command's
// help.
func cmdHelp(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("help", "llmlb help [COMMAND]", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch fs.NArg() {
	case 0:
		fmt.Fprint(stdout, usage())
		return nil
	case 1:
		name := fs.Arg(0)
		if name == "help" || !slices.ContainsFunc(commands(), func(c command) bool { return c.name == name }) {
			fmt.Fprint(stdout, usage())
			if name == "help" {
				return nil
			}
			return fmt.Errorf("help: unknown command %q", name)
		}
		// The command's own --help, so its flags are listed where they
		// are defined.
		return run(context.Background(), []string{name, "--help"}, nil, stdout, stdout)
	}
	fs.Usage()
	return errors.New("help takes at most one command")
}

// newFlagSet returns the flag set of the command name. Its --help starts
// with what the command does and an example, from [commands], then the
// synopsis and the flags.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		for _, c := range commands() {
			if c.name == name {
				fmt.Fprintf(stderr, "%s\n\nExample:\n\n\t%s\n\n", c.about, c.example)
			}
		}
		fmt.Fprintf(stderr, "Usage: %s\n", synopsis)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprint(stderr, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// cmdHashKey prints the hash of the key given as its argument or, without
// one, read from stdin (one line; the line end is not part of the key).
func cmdHashKey(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("hash-key", "llmlb hash-key [KEY]   (or the key on standard input)", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var key string
	switch fs.NArg() {
	case 0:
		b, err := io.ReadAll(io.LimitReader(stdin, 64<<10))
		if err != nil {
			return fmt.Errorf("hash-key: %w", err)
		}
		key = strings.TrimRight(string(b), "\r\n")
	case 1:
		key = fs.Arg(0)
	default:
		fs.Usage()
		return errors.New("hash-key takes one key")
	}
	if key == "" || strings.TrimSpace(key) != key || strings.ContainsAny(key, " \t\r\n") {
		return errors.New("hash-key: the key must be one word without spaces, as it is sent after \"Authorization: Bearer \"")
	}
	if len(key) < 16 {
		fmt.Fprintln(stderr, "llmlb: warning: a key shorter than 16 characters is easy to guess; openssl rand -hex 24 makes a good one")
	}
	fmt.Fprintln(stdout, proxy.HashKey(key))
	return nil
}

// cmdVersion prints the version and build information the Go toolchain
// recorded in the binary.
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "llmlb version", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version: unexpected argument %q", fs.Arg(0))
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	fmt.Fprint(stdout, versionText(info))
	return nil
}

// versionText renders build information: the module version on the first
// line ("(devel)" for a build from a work tree without a version), then
// the Go version, platform and the VCS revision when recorded. A nil info
// says the binary carries none.
func versionText(info *debug.BuildInfo) string {
	if info == nil {
		return "llmlb (no build information recorded)\n"
	}
	var b strings.Builder
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	fmt.Fprintf(&b, "llmlb %s\n", version)
	set := map[string]string{}
	for _, s := range info.Settings {
		set[s.Key] = s.Value
	}
	fmt.Fprintf(&b, "go:       %s", info.GoVersion)
	if set["GOOS"] != "" {
		fmt.Fprintf(&b, " %s/%s", set["GOOS"], set["GOARCH"])
	}
	b.WriteByte('\n')
	if rev := set["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision: %s", rev)
		if t := set["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " (%s)", t)
		}
		if set["vcs.modified"] == "true" {
			b.WriteString(", modified")
		}
		b.WriteByte('\n')
	}
	if info.Path != "" {
		fmt.Fprintf(&b, "path:     %s\n", info.Path)
	}
	return b.String()
}

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

func faultKinds() []string {
	var s []string
	for _, k := range sim.FaultKinds() {
		s = append(s, string(k))
	}
	return s
}

func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", "llmlb sim [--engine vllm] [--preset h100-8b] [--listen ADDR] [--model NAME] [--lora a,b] [--max-lora N] [--speed X] [--count N] [--fault KIND[:k=v,...],... [--fault-on 0,2]]", stderr)
	engine := fs.String("engine", "vllm", "engine flavour to emulate: vllm, sglang, triton-tensorrt-llm or trtllm-serve")
	preset := fs.String("preset", "h100-8b", "engine model preset: "+strings.Join(sim.PresetNames(), ", "))
	listen := fs.String("listen", "127.0.0.1:8001", "address of the first server; --count servers take consecutive ports")
	model := fs.String("model", "llama-3.1-8b", "base model name served")
	lora := fs.String("lora", "", "comma-separated LoRA adapter names served on top of the model")
	speed := fs.Float64("speed", 1, "run this many times faster than real time")
	count := fs.Int("count", 1, "number of servers to start")
	maxLoRA := fs.Int("max-lora", 0, "adapters a batch may use at once (0: the preset's)")
	faultSpec := fs.String("fault", "", "faults to show, e.g. die-mid-stream:after=5s,for=10s (kinds: "+strings.Join(faultKinds(), ", ")+"); switch them at runtime with PUT /sim/faults")
	faultOnList := fs.String("fault-on", "0", "comma-separated indexes (from 0) of the servers --fault applies to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	faults, err := sim.ParseFaults(*faultSpec)
	if err != nil {
		return fmt.Errorf("sim: --fault: %w", err)
	}
	var faultOn []int
	for w := range strings.SplitSeq(*faultOnList, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || i < 0 {
			return fmt.Errorf("sim: --fault-on %q: not a list of server indexes", *faultOnList)
		}
		faultOn = append(faultOn, i)
	}
	ecfg, err := sim.Preset(*preset)
	if err != nil {
		return fmt.Errorf("sim: --preset: %w", err)
	}
	if *maxLoRA > 0 {
		ecfg.MaxLoRA = *maxLoRA
	}
	if *count < 1 {
		return errors.New("sim: --count must be at least 1")
	}
	ecfg.CacheOnCompute = sim.CachesOnCompute(*engine)
	fc := sim.FleetConfig{Server: sim.ServerConfig{Engine: *engine, Model: *model}, Speed: *speed, Listen: *listen, Faults: faults, FaultOn: faultOn}
	if *lora != "" {
		fc.Server.Adapters = strings.Split(*lora, ",")
	}
	for range *count {
		fc.Engines = append(fc.Engines, ecfg)
	}
	fleet, err := sim.StartFleet(fc)
	if err != nil {
		return err
	}
	for i, u := range fleet.URLs {
		note := ""
		if slices.Contains(faultOn, i) && len(faults) > 0 {
			note = " with faults " + faults.String()
		}
		fmt.Fprintf(stdout, "sim: %s (%s, x%g) serving %s at %s%s\n", *engine, *preset, *speed, *model, u, note)
	}
	<-ctx.Done()
	fleet.Close()
	return nil
}
