package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

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
	info, _ := debug.ReadBuildInfo() // nil when the binary carries none
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
