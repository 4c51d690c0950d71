package demo

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/llmlb/llmlb/sim"
)

// closeCounter is a real transport that counts CloseIdleConnections calls.
type closeCounter struct {
	*http.Transport
	closes atomic.Int64
}

func (c *closeCounter) CloseIdleConnections() {
	c.closes.Add(1)
	c.Transport.CloseIdleConnections()
}

// Run closes the connections it leaves idle when ctx ends: one dialled
// for a request ctx cancelled stays in the pool unused, and a server
// shutting down waits 5 s for such a connection before counting it idle,
// so the demo's balancer, stopped right after its load, warned "grace
// period over" under make test.
func TestLoadRunClosesItsIdleConnections(t *testing.T) {
	s, err := sim.NewServer(sim.ServerConfig{Model: "m"}, sim.NewSteady(sim.SteadyConfig{Speed: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Handler().ServeHTTP(w, r)
		if served.Add(1) == 4 {
			cancel()
		}
	}))
	defer srv.Close()
	tr := &closeCounter{Transport: &http.Transport{}}
	l := &Load{URL: srv.URL, Model: "m", Concurrency: 2, MaxTokens: 4, Client: &http.Client{Transport: tr}}
	l.Run(ctx)
	if r := l.Results(); r.OK == 0 {
		t.Fatalf("no request succeeded: %+v", r)
	}
	if tr.closes.Load() == 0 {
		t.Error("Run returned with its idle connections still open")
	}
}
