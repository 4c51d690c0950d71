package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/doccheck"
)

// The README's other checks, which read files only, are in
// internal/doccheck, where make check's go test -short runs them; this
// one builds and runs llmlb.

// shownCommands returns the commands md shows being run: each inline code
// span, and each line of a fenced block, that starts with prog and a
// word, with the --flags that follow on it (a # comment cut off).
func shownCommands(md, prog string) map[string][]string {
	var lines []string
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(md, -1) {
		lines = append(lines, m[1])
	}
	for _, block := range doccheck.Fenced(md, "") {
		lines = append(lines, strings.Split(block, "\n")...)
	}
	word := regexp.MustCompile(`^` + prog + ` ([a-z][a-z-]*)\b(.*)`)
	flag := regexp.MustCompile(`(?:^|[\s\[])--([a-z][a-z0-9-]*)`)
	out := map[string][]string{}
	for _, l := range lines {
		l, _, _ = strings.Cut(strings.TrimSpace(l), "#")
		m := word.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		flags := out[m[1]]
		for _, f := range flag.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(flags, f[1]) {
				flags = append(flags, f[1])
			}
		}
		out[m[1]] = flags
	}
	return out
}

// TestREADMECommandsExist: every `llmlb X` the README shows is a command
// `llmlb help` lists, with the flags shown in its --help, and every `make
// X` is a target of the Makefile.
func TestREADMECommandsExist(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "llmlb")
	build := exec.CommandContext(t.Context(), goBin, "build", "-o", bin, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "LLMLB_") { // llmlb reads those as config
				cmd.Env = append(cmd.Env, kv)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("llmlb %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^\t([a-z][a-z-]*)  `).FindAllStringSubmatch(run("help"), -1) {
		listed = append(listed, m[1])
	}
	shown := shownCommands(md, "llmlb")
	if len(shown) < 5 {
		t.Errorf("README shows %d llmlb commands: %v", len(shown), shown)
	}
	for cmd, flags := range shown {
		if !slices.Contains(listed, cmd) {
			t.Errorf("README shows `llmlb %s`, which llmlb help does not list (%v)", cmd, listed)
			continue
		}
		if len(flags) == 0 {
			continue
		}
		help := run(cmd, "--help")
		for _, f := range flags {
			if !regexp.MustCompile(`(?m)^\s+-` + f + `\b`).MatchString(help) {
				t.Errorf("README shows `llmlb %s --%s`, which llmlb %s --help does not list", cmd, f, cmd)
			}
		}
	}

	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z-]*):`).FindAllSubmatch(mk, -1) {
		targets = append(targets, string(m[1]))
	}
	makes := shownCommands(md, "make")
	for _, want := range []string{"check", "test", "demo"} {
		if _, ok := makes[want]; !ok {
			t.Errorf("README does not show `make %s`", want)
		}
	}
	for target := range makes {
		if !slices.Contains(targets, target) {
			t.Errorf("README shows `make %s`, which the Makefile does not define", target)
		}
	}
}
