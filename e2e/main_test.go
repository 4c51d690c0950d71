package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// TestMain skips the whole package under -short: these tests run the
// balancer and the real tools in real time, for about a minute, and
// make check's inner loop leaves them to make test.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped under -short; make test runs it")
		os.Exit(0)
	}
	os.Exit(m.Run())
}
