package proxy

import (
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/pipenet"
	"github.com/llmlb/llmlb/kvevents"
	"github.com/llmlb/llmlb/prefix"
)

// TestTokenizeFailuresPause: a server that cannot tokenize (no /tokenize,
// as an older vLLM or another engine) costs one request a round trip, not
// every request: after a failure no request asks until a second has
// passed, and after a second failure in a row two seconds. Every request
// is answered meanwhile. In virtual time, on the pipe network.
func TestTokenizeFailuresPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if r.URL.Path == "/tokenize" {
				calls.Add(1)
				http.NotFound(w, r)
				return
			}
			io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
		})
		const id = "http://gpu-0:80"
		// Tokenizing starts once some backend has stored a block.
		store := kvevents.NewStore()
		store.Apply(id, kvevents.Batch{Rank: -1, Events: []kvevents.Event{{Kind: kvevents.Stored, Hashes: []uint64{1}, Tokens: make([]uint32, 16), BlockSize: 16}}})
		bal, err := balancer.New(balancer.DefaultConfig(), balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig()), Events: store}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bal.ReadsCacheEvents() {
			t.Fatal("the default policy does not read KV events")
		}
		u, _ := url.Parse(id)
		bal.Update(balancer.Spec{ID: id, URL: u, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady})

		pn := &pipenet.Network{}
		servers := []*http.Server{{Handler: backend}}
		go servers[0].Serve(pn.Listen("gpu-0:80"))
		px := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry(), KVEvents: store})
		px.base.DialContext = dialBodyConn(pn.DialContext)
		servers = append(servers, px.HTTPServer(nil))
		go servers[1].Serve(pn.Listen("llmlb:80"))
		f := &bubbleFront{net: pn, px: px, client: &http.Client{Transport: &http.Transport{DialContext: pn.DialContext}}, servers: servers, base: px.base}
		defer f.close()

		send := func(n int, want int64, when string) {
			t.Helper()
			for range n {
				resp, err := f.post(t, "/v1/completions", body("completion", ""))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d, want 200", when, resp.StatusCode)
				}
			}
			if got := calls.Load(); got != want {
				t.Errorf("%s: /tokenize asked %d times in all, want %d", when, got, want)
			}
		}
		send(5, 1, "five requests at once")
		advance(time.Second - time.Millisecond)
		send(1, 1, "just under a second after the failure")
		advance(time.Millisecond)
		send(1, 2, "a second after the failure")
		advance(2*time.Second - time.Millisecond)
		send(1, 2, "just under two seconds after the second failure")
		advance(time.Millisecond)
		send(1, 3, "two seconds after the second failure")
	})
}
