package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

// TestBackendHeaderNamesBackendNotAddress: x-llmlb-backend carries a
// backend's configured name, or b1 for the first unnamed one, never an
// address; the admin side keeps naming backends by URL (/metrics labels,
// /debug/backends ids), and /debug/backends gives each one's name.
func TestBackendHeaderNamesBackendNotAddress(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100})
	cfg := testConfig(urls)
	cfg.Balancer.Policy = "round-robin"
	cfg.Backends[0].Name = "gpu-a"
	inst := startTest(t, cfg, 2)

	seen := map[string]int{}
	for range 6 {
		seen[completeOnce(t, inst.Addr)]++
	}
	if len(seen) != 2 || seen["gpu-a"] == 0 || seen["b1"] == 0 {
		t.Errorf("x-llmlb-backend values %v, want gpu-a and b1", seen)
	}
	if got := backendNames(t, inst.AdminAddr); got["gpu-a"] != urls[0] || got["b1"] != urls[1] {
		t.Errorf("/debug/backends names %v, want gpu-a for %s and b1 for %s", got, urls[0], urls[1])
	}
	resp, err := http.Get("http://" + inst.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `backend="`+urls[0]+`"`) {
		t.Errorf("/metrics does not label the named backend by its URL %s", urls[0])
	}
}
