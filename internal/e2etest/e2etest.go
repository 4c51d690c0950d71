// Package e2etest holds what the end-to-end suites (e2e and e2e/soak)
// share: they are packages of their own so that the soak, which runs
// outside the race build, compiles little beyond the binary's packages.
package e2etest

import (
	"cmp"
	"net/http"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy"
)

// WaitBackends waits until the admin listener at adminAddr reports n
// backends ready with their models, polling every 20 ms, and fails t
// after 10 s: long enough for a loaded machine, where it only waits.
func WaitBackends(t testing.TB, adminAddr string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(deadline); <-tick.C {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
		if err != nil {
			continue
		}
		ready := 0
		for _, b := range bs {
			if b.State == balancer.StateReady && len(b.Models) > 0 {
				ready++
			}
		}
		if ready == n {
			return
		}
	}
	t.Fatalf("backends not ready within 10s")
}

// BackendHeader returns what x-llmlb-backend says for the backend id: its
// name where /debug/backends gives one, else its ID.
func BackendHeader(t testing.TB, adminAddr, id string) string {
	t.Helper()
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.ID == id {
			return cmp.Or(b.Name, b.ID)
		}
	}
	t.Fatalf("backend %s not in /debug/backends", id)
	return ""
}

// PollPause waits a little between two looks at a live system over HTTP.
func PollPause() { <-time.After(5 * time.Millisecond) }
