package overhead

import (
	"context"
	"strings"
	"testing"
)

// TestOverheadGoProxyRefusesNonHTTPURL: the go row's mode refuses a backend
// that is not an http(s) URL, saying which, instead of serving a proxy to
// nowhere.
func TestOverheadGoProxyRefusesNonHTTPURL(t *testing.T) {
	for _, u := range []string{"localhost:8000", "ftp://x", "http://"} {
		var out strings.Builder
		err := ServeGoProxy(context.Background(), u, &out)
		if err == nil || !strings.Contains(err.Error(), "is not an http(s) URL") || !strings.Contains(err.Error(), u) || out.Len() > 0 {
			t.Errorf("ServeGoProxy(%q) = %v, printed %q; want it refused", u, err, out.String())
		}
	}
}
