package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// waitFresh waits until every backend has fresh metrics.
func waitFresh(t *testing.T, adminAddr string, n int) {
	t.Helper()
	if !waitFor(time.Minute, func() bool {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
		fresh := 0
		for _, b := range bs {
			if b.State == balancer.StateReady && !b.Stale {
				fresh++
			}
		}
		return err == nil && fresh == n
	}) {
		t.Fatal("metrics not fresh within a minute")
	}
}

// fire sends bodies to the balancer with at most conc at once and returns
// how many each backend answered; every request must succeed.
func fire(t *testing.T, addr string, bodies []string, conc int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for _, b := range bodies {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(b))
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d", resp.StatusCode)
				return
			}
			mu.Lock()
			got[resp.Header.Get("X-Llmlb-Backend")]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

func completion(prompt string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": maxTokens})
	return string(b)
}

// TestBurstDoesNotHerd is the herding test: 200 requests with
// distinct prompts arrive at once at 4 idle backends whose last scrape is
// old (scrapes every 10 minutes, trusted for an hour). The backends take a
// second to the first token, so every pick happens before any answer
// teaches anything, and saturation is off, so nothing but the in-flight
// ledger spreads them: no backend may get more than 35%.
func TestBurstDoesNotHerd(t *testing.T) {
	urls := simBackends(t, 4, sim.SteadyConfig{Speed: 1, FirstTokenLatency: time.Second, MaxRunning: 256})
	cfg := testConfig(urls)
	cfg.Scrape.Interval = 10 * time.Minute
	cfg.Scrape.StaleAfter = time.Hour
	cfg.Balancer.Saturation.Queue = 0
	inst := startTest(t, cfg, 4)
	waitFresh(t, inst.AdminAddr, 4)
	var bodies []string
	for i := range 200 {
		bodies = append(bodies, completion(fmt.Sprintf("request %d: %s", i, strings.Repeat("distinct words ", 100+i%50)), 2))
	}
	got := fire(t, inst.Addr, bodies, 200)
	t.Logf("200 requests at once over 4 backends: %v", got)
	for id, n := range got {
		if n > 70 {
			t.Errorf("%s got %d of 200 (%.0f%%), want at most 35%%", id, n, float64(n)/2)
		}
	}
}

// TestSharedPrefixRequestsEndToEnd: 50 requests sharing a 4,000-token
// system prompt with distinct questions, 10 at a time, through llmlb to
// emulated servers that run 2 requests at once and decode slowly, so that
// requests queue at the servers: every one is answered, every ledger is
// back to 0, and the prefix index remembers the prompt on each backend
// that served one, and on no other. Where the requests go depends on the
// times llmlb measures, so this test does not ask: the rule (they stay on
// the holder until its queue makes a copy pay, then spill to a second
// server) is bench's TestSharedPrefixStaysThenSpills, in virtual time.
func TestSharedPrefixRequestsEndToEnd(t *testing.T) {
	urls := simBackends(t, 4, sim.SteadyConfig{Speed: 4, MaxRunning: 2, DecodeTokensPerSecond: 30})
	inst := startTest(t, testConfig(urls), 4)
	waitFresh(t, inst.AdminAddr, 4)
	system := strings.Repeat("You are a careful assistant for the billing team. ", 320) // ~16,000 bytes, ~4,000 tokens
	var bodies []string
	for i := range 50 {
		bodies = append(bodies, completion(fmt.Sprintf("%s\nQuestion %d: what is %d + %d?", system, i, i, i*7), 16))
	}
	got := fire(t, inst.Addr, bodies, 10)
	t.Logf("50 shared-prefix requests: %v", got)
	answered := 0
	for _, n := range got {
		answered += n
	}
	if answered != 50 {
		t.Errorf("%d of 50 requests answered", answered)
	}
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.InFlight != 0 {
			t.Errorf("%s: %d in flight after every request was answered", b.ID, b.InFlight)
		}
	}

	// Another question on the same prompt: the index matches the system
	// prompt where the 50 went, and nothing elsewhere.
	matched := routeMatches(t, inst.AdminAddr, completion(system+"\nQuestion 50: what is 50 + 350?", 16))
	names := backendNames(t, inst.AdminAddr)
	servedBy := map[string]bool{}
	for name := range got {
		servedBy[names[name]] = true
	}
	for _, u := range urls {
		if servedBy[u] != (matched[u] >= 3500) {
			t.Errorf("%s served the prompt: %v; the index matches %d of its tokens there", u, servedBy[u], matched[u])
		}
	}
}

// TestModelAliasRewritesBothWays: a public name routed to the served model
// reaches the backend as the served name and comes back to the client as
// its own, streaming and not; /v1/models lists it; /debug/route explains
// without sending.
func TestModelAliasRewritesBothWays(t *testing.T) {
	urls := simBackends(t, 2, sim.SteadyConfig{Speed: 100})
	cfg := testConfig(urls)
	cfg.Models = []balancer.ModelRoute{{Name: "house-model", Targets: []balancer.ModelTarget{{Model: testModel, Weight: 1}}}}
	inst := startTest(t, cfg, 2)
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"prompt":"hi there","max_tokens":3,"model":"house-model","stream":%v}`, stream)
		resp, err := http.Post("http://"+inst.Addr+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%v: status %d: %s", stream, resp.StatusCode, out)
		}
		if strings.Contains(string(out), testModel) || !strings.Contains(string(out), `"house-model"`) {
			t.Errorf("stream=%v: response names the served model or not the public one:\n%s", stream, out)
		}
	}
	resp, err := http.Get("http://" + inst.Addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(models), `"house-model"`) {
		t.Errorf("/v1/models lacks the alias: %s", models)
	}

	before := totalRequests(t, inst.AdminAddr)
	resp, err = http.Post("http://"+inst.AdminAddr+"/debug/route", "application/json",
		strings.NewReader(`{"model":"house-model","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var route struct {
		Target      string               `json:"target_model"`
		Explanation balancer.Explanation `json:"explanation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&route); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if route.Target != testModel || len(route.Explanation.Backends) != 2 || len(route.Explanation.Chosen) == 0 || route.Explanation.Reason == "" {
		t.Errorf("/debug/route = %+v", route)
	}
	for _, b := range route.Explanation.Backends {
		if b.Candidate == nil || b.TTFT <= 0 {
			t.Errorf("backend %s has no breakdown: %+v", b.ID, b)
		}
	}
	if after := totalRequests(t, inst.AdminAddr); after != before {
		t.Errorf("/debug/route sent %d requests", after-before)
	}
}

func totalRequests(t *testing.T, adminAddr string) int64 {
	t.Helper()
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, b := range bs {
		n += b.Requests
	}
	return n
}

// TestTwoReplicasFollowAConversation: two llmlb processes that share
// nothing, each taking every other turn of chat conversations on one
// system prompt, send each conversation's later turns to one backend (its
// home, the same for both, whatever each one's index saw), and the
// conversations to more than one backend. Before conversations had a key
// of their own, every turn went to the system prompt's backend.
func TestTwoReplicasFollowAConversation(t *testing.T) {
	urls := simBackends(t, 4, sim.SteadyConfig{Speed: 50})
	cfg := testConfig(urls)
	cfg.Cluster.StatelessReplicas = true
	lbs := []*serve.Instance{startTest(t, cfg, 4), startTest(t, cfg, 4)}
	for _, lb := range lbs {
		waitFresh(t, lb.AdminAddr, 4)
	}
	system := strings.Repeat("You are the careful assistant of the billing team. ", 120)
	homes := map[string]int{}
	for c := range 8 {
		msgs := []map[string]string{{"role": "system", "content": system}}
		var got []string
		for turn := range 4 {
			msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Conversation %d, question %d: %s", c, turn, strings.Repeat("what is due? ", 30))})
			body, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "max_tokens": 8})
			resp, err := http.Post("http://"+lbs[turn%2].Addr+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Fatal(err)
			}
			var out struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) == 0 {
				t.Fatalf("turn %d of conversation %d: status %d, %v", turn, c, resp.StatusCode, err)
			}
			got = append(got, resp.Header.Get("X-Llmlb-Backend"))
			msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
		}
		for _, id := range got[2:] {
			if id != got[1] {
				t.Errorf("conversation %d: later turns on %v (turns 1-4, alternating replicas), want one backend", c, got)
				break
			}
		}
		homes[got[1]]++
	}
	if len(homes) < 2 {
		t.Errorf("8 conversations' later turns all went to %v, want their own homes", homes)
	}
}
