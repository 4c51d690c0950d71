package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/llmlb/llmlb/internal/config"
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
			"Validate runs the checks serve runs before it listens, on the config file and the certificate, key and CA files it names, and lists every problem, each with its key; it exits 0 and prints ok when there is none.",
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
		{"plan", "the fewest servers that meet a TTFT target for your traffic",
			"Plan replays a trace (a capture of your traffic, or a Mooncake-format trace) on emulated servers of one class in virtual time and prints, per policy, the fewest servers whose TTFT p90 meets the target at the trace's load and above.",
			"llmlb plan --trace capture.jsonl --ttft-p90 500ms"},
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
	case "plan":
		return cmdPlan(ctx, args, stdout, stderr)
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
