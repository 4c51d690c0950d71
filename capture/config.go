package capture

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Config is the `capture:` section of config.yaml. Capture is off while
// Path is empty.
type Config struct {
	// Path is the file lines are written to; rotated files sit beside it
	// as Path.1 (newest) to Path.MaxFiles. Empty: no capture. (default
	// empty)
	Path string `mapstructure:"path"`
	// Sample is the share of requests captured, 0 to 1. (default 1)
	Sample float64 `mapstructure:"sample"`
	// Salt keys the block ids and the session and conversation keys; it
	// may come only from the environment (LLMLB_CAPTURE_SALT), never from
	// the config file. At least [MinSalt] bytes. Empty with no SaltFile:
	// a random salt for each capture, so its ids match no other
	// capture's. (default empty)
	Salt string `mapstructure:"salt"`
	// SaltFile holds the salt (a trailing newline is dropped), as a Docker
	// or Kubernetes secret mounts it. (default empty)
	SaltFile string `mapstructure:"salt_file"`
	// BlockTokens is the prompt tokens each hash id stands for, 16 to 512
	// in steps of 16. A replay knows a shared prefix to its last whole
	// block, so the bench's replay of a 512-token capture (the Mooncake
	// traces' block, which other tools read) misses what the live run
	// hit; 128 keeps it within a few per cent, for lines about twice as
	// long (docs/replay.md). (default 128)
	BlockTokens int `mapstructure:"block_tokens"`
	// MaxBytes is the size, in bytes, at which the file is rotated, at
	// least 64 KiB. (default 268435456: 256 MiB)
	MaxBytes int64 `mapstructure:"max_bytes"`
	// MaxFiles is how many rotated files are kept beside the current one,
	// 0 to 100; the oldest beyond it is removed. (default 3)
	MaxFiles int `mapstructure:"max_files"`
}

// MinSalt is the shortest salt accepted, in bytes: a short one could be
// found by trying every salt against a text one knows.
const MinSalt = 16

// minMaxBytes is the smallest rotation size: a file smaller would hold a
// handful of long prompts' lines.
const minMaxBytes = 64 << 10

// DefaultConfig returns the capture defaults: off.
func DefaultConfig() Config {
	return Config{Sample: 1, BlockTokens: DefaultBlockTokens, MaxBytes: 256 << 20, MaxFiles: 3}
}

// Enabled reports whether c captures.
func (c Config) Enabled() bool { return c.Path != "" }

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("capture."+key+": "+format, args...))
	}
	if !(c.Sample >= 0 && c.Sample <= 1) { // NaN too
		bad("sample", "must be a ratio from 0 to 1, got %v", c.Sample)
	}
	if c.Salt != "" && c.SaltFile != "" {
		bad("salt_file", "set the salt once: LLMLB_CAPTURE_SALT or salt_file, not both")
	}
	if c.Salt != "" && len(c.Salt) < MinSalt {
		bad("salt", "must be at least %d bytes, got %d", MinSalt, len(c.Salt))
	}
	if c.BlockTokens < 16 || c.BlockTokens > BlockTokens || c.BlockTokens%16 != 0 {
		bad("block_tokens", "must be 16 to %d in steps of 16, got %d", BlockTokens, c.BlockTokens)
	}
	if c.MaxBytes < minMaxBytes {
		bad("max_bytes", "must be at least %d (64 KiB), got %d", minMaxBytes, c.MaxBytes)
	}
	if c.MaxFiles < 0 || c.MaxFiles > 100 {
		bad("max_files", "must be 0 to 100, got %d", c.MaxFiles)
	}
	if strings.HasSuffix(c.Path, "/") {
		bad("path", "names a directory, want a file: %q", c.Path)
	}
	return errors.Join(errs...)
}

// LoadSalt returns the salt c names: Salt, or SaltFile's content without
// its trailing newline, or nil for none (a random one per capture). Serve
// reads it at start and at each reload that changes the section, and
// `llmlb validate` checks the file.
func (c Config) LoadSalt() ([]byte, error) {
	if c.SaltFile == "" {
		if c.Salt == "" {
			return nil, nil
		}
		return []byte(c.Salt), nil
	}
	b, err := os.ReadFile(c.SaltFile)
	if err != nil {
		return nil, fmt.Errorf("capture.salt_file: %w", err)
	}
	salt := []byte(strings.TrimRight(string(b), "\r\n"))
	if len(salt) < MinSalt {
		return nil, fmt.Errorf("capture.salt_file: the salt in %s must be at least %d bytes, got %d", c.SaltFile, MinSalt, len(salt))
	}
	return salt, nil
}
