package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/llmlb/llmlb/proxy"
)

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
