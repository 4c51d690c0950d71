package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// TestBackendsTeachTheirTokenizers: two emulated servers whose tokenizers
// read 3 and 7 bytes of text a token answer distinct prompts through
// llmlb; each backend's learned bytes per token, on /debug/backends, is
// its own tokenizer's, from the usage of its answers.
func TestBackendsTeachTheirTokenizers(t *testing.T) {
	rates := map[string]int{}
	var urls []string
	for _, bpt := range []int{3, 7} {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel, BytesPerToken: bpt}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
		rates[srv.URL] = bpt
	}
	inst := startTest(t, testConfig(urls), 2)
	var bodies []string
	for i := range 40 {
		bodies = append(bodies, completion(fmt.Sprintf("Document %d. %s", i, strings.Repeat(fmt.Sprintf("line %d of a report. ", i), 150)), 4))
	}
	got := fire(t, inst.Addr, bodies, 4)
	t.Logf("40 distinct prompts: %v", got)
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		want := float64(rates[b.URL])
		t.Logf("%s (%v bytes a token): %d requests, learned %.2f, index fit %.2f", b.Name, want, b.Requests, b.BytesPerToken, b.IndexFit)
		if b.Requests == 0 {
			t.Errorf("%s answered nothing: both servers should get some of 40 distinct prompts", b.Name)
			continue
		}
		if b.BytesPerToken < want || b.BytesPerToken > want*1.01 {
			t.Errorf("%s: learned %.2f bytes a token, want its tokenizer's %v", b.Name, b.BytesPerToken, want)
		}
	}
}
