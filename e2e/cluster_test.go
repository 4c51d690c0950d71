package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/e2etest"
	"github.com/llmlb/llmlb/internal/redistest"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// testKeyC is a key without limits, testKeyD one with a tokens limit.
const (
	testKeyC = "sk-llmlb-main-charlie-5e4d3c2b1a0f9e8d"
	testKeyD = "sk-llmlb-main-delta-9f8e7d6c5b4a3f2e1d"
)

// fleetConfig is a config for the backends at urls with four keys,
// alpha at 30 requests a minute, bravo at 3, charlie unlimited and delta
// at 1,500 tokens a minute,
// sessions by X-Session, and the fleet's state, load included, in the
// Redis at addr ("": none).
func fleetConfig(urls []string, addr string) config.Config {
	cfg := testConfig(urls)
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{
		{Name: "alpha", Key: proxy.HashKey(testKeyA), RequestsPerMinute: 30},
		{Name: "bravo", Key: proxy.HashKey(testKeyB), RequestsPerMinute: 3},
		{Name: "charlie", Key: proxy.HashKey(testKeyC)},
		{Name: "delta", Key: proxy.HashKey(testKeyD), TokensPerMinute: 1500},
	}}
	cfg.Balancer.Session.Header = "X-Session"
	cfg.Cluster.Redis.Address = addr
	cfg.Cluster.ShareLoad = true
	cfg.Cluster.Redis.Timeout = 250 * time.Millisecond // a loaded CI machine
	return cfg
}

// replica is one llmlb of a fleet, which the test may stop before its end.
type replica struct {
	inst *serve.Instance
	stop func()
}

// startReplica runs llmlb for cfg until stop or the test's end.
func startReplica(t *testing.T, cfg config.Config, n int) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	inst, err := serve.Start(ctx, cfg, nil, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := false
	r := &replica{inst: inst}
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := inst.Wait(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}
	t.Cleanup(r.stop)
	e2etest.WaitBackends(t, inst.AdminAddr, n)
	return r
}

// clusterUp reports whether the replica's llmlb_cluster_up is 1.
func clusterUp(t *testing.T, adminAddr string) bool {
	t.Helper()
	return metricLine(t, adminAddr, "llmlb_cluster_up 1")
}

// statusPage returns the replica's status page.
func statusPage(t *testing.T, adminAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricLine reports whether the replica's /metrics has line.
func metricLine(t *testing.T, adminAddr, line string) bool {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), "\n"+line+"\n")
}

// fleetPost sends a small completion with key through addr and returns
// the status, the backend that answered and Retry-After.
func fleetPost(t *testing.T, addr, key, session string) (status int, backend, retryAfter string) {
	t.Helper()
	return fleetPostPrompt(t, addr, key, session, "hello there")
}

// fleetPostPrompt is fleetPost with a prompt of the caller's.
func fleetPostPrompt(t *testing.T, addr, key, session, prompt string) (status int, backend, retryAfter string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"`+prompt+`","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	if session != "" {
		req.Header.Set("X-Session", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Llmlb-Backend"), resp.Header.Get("Retry-After")
}

// admitted sends n requests with key round-robin over the replicas and
// counts those answered 200; every other answer must be 429 with
// Retry-After.
func admitted(t *testing.T, reps []*replica, key string, n int) int {
	t.Helper()
	return admittedPrompt(t, reps, key, n, "hello there")
}

// admittedPrompt is admitted with a prompt of the caller's.
func admittedPrompt(t *testing.T, reps []*replica, key string, n int, prompt string) int {
	t.Helper()
	ok := 0
	for i := range n {
		status, _, retry := fleetPostPrompt(t, reps[i%len(reps)].inst.Addr, key, "", prompt)
		switch {
		case status == http.StatusOK:
			ok++
		case status != http.StatusTooManyRequests || retry == "":
			t.Fatalf("request %d: %d (Retry-After %q), want 200 or 429 with Retry-After", i, status, retry)
		}
	}
	return ok
}

// Three replicas sharing Redis admit what one llmlb admits, keep a
// session on one server whichever replica it reaches, answer every
// request while Redis is killed, are one fleet again once it is back,
// and a replica that restarts finds the session and the limit as the
// fleet left them.
func TestReplicasActAsOne(t *testing.T) {
	r := redistest.Start(t)
	urls := simBackends(t, 3, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})

	// One llmlb alone, then three replicas: 60 requests at 30 a minute.
	// And 30 requests of some 100 prompt tokens (and 4 of completion,
	// settled when each answer's usage is in) at 1,500 tokens a minute.
	long := strings.Repeat("word ", 80)
	alone := startReplica(t, fleetConfig(urls, ""), 3)
	one := admitted(t, []*replica{alone}, testKeyA, 60)
	oneTokens := admittedPrompt(t, []*replica{alone}, testKeyD, 30, long)
	alone.stop()
	cfg := fleetConfig(urls, r.Addr)
	reps := []*replica{startReplica(t, cfg, 3), startReplica(t, cfg, 3), startReplica(t, cfg, 3)}
	for _, rep := range reps {
		if !waitFor(10*time.Second, func() bool { return clusterUp(t, rep.inst.AdminAddr) }) {
			t.Fatal("a replica did not join Redis within 10s")
		}
	}
	// Each hears the other two's load.
	for _, rep := range reps {
		if !waitFor(10*time.Second, func() bool { return metricLine(t, rep.inst.AdminAddr, "llmlb_cluster_replicas 3") }) {
			t.Fatal("a replica did not hear the other two's load within 10s")
		}
	}
	// A stream through one replica is in the others' view of its server,
	// and leaves it when the client goes away.
	streamCtx, endStream := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(streamCtx, http.MethodPost, "http://"+reps[0].inst.Addr+"/v1/completions",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"a long story","max_tokens":40000,"stream":true}`)) // 20s at 2,000 tokens/s
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testKeyC)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	streamURL := backendNames(t, reps[0].inst.AdminAddr)[resp.Header.Get("X-Llmlb-Backend")]
	peersOn := func(adminAddr string) int64 {
		bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
		if err != nil {
			return -1
		}
		for _, b := range bs {
			if b.URL == streamURL {
				return b.PeersInFlight
			}
		}
		return -1
	}
	if !waitFor(10*time.Second, func() bool { return peersOn(reps[1].inst.AdminAddr) == 1 && peersOn(reps[2].inst.AdminAddr) == 1 }) {
		t.Errorf("a stream through one replica: the others count %d and %d in flight for its server, want 1", peersOn(reps[1].inst.AdminAddr), peersOn(reps[2].inst.AdminAddr))
	}
	if n := peersOn(reps[0].inst.AdminAddr); n != 0 {
		t.Errorf("the replica that sent the stream counts %d of it as its peers'", n)
	}
	endStream()
	resp.Body.Close()
	if !waitFor(10*time.Second, func() bool { return peersOn(reps[1].inst.AdminAddr) == 0 }) {
		t.Errorf("the stream's client went away: still %d in flight in another replica's view", peersOn(reps[1].inst.AdminAddr))
	}

	three := admitted(t, reps, testKeyA, 60)
	t.Logf("60 requests at 30 a minute: one llmlb admitted %d, three replicas %d", one, three)
	threeTokens := admittedPrompt(t, reps, testKeyD, 30, long)
	if threeTokens < oneTokens-2 || threeTokens > oneTokens+2 {
		t.Errorf("three replicas admitted %d of 30 requests at 1,500 tokens a minute; one llmlb alone admitted %d", threeTokens, oneTokens)
	}
	t.Logf("30 requests of some 100 tokens at 1,500 tokens a minute: one llmlb admitted %d, three replicas %d", oneTokens, threeTokens)
	if three < one-2 || three > one+2 {
		t.Errorf("three replicas admitted %d of 60 at 30 a minute; one llmlb alone admitted %d", three, one)
	}

	// One session through every replica: one server.
	homes := map[string]int{}
	for i := range 12 {
		status, be, _ := fleetPost(t, reps[i%3].inst.Addr, testKeyC, "conversation-7")
		if status != http.StatusOK {
			t.Fatalf("session request %d: %d", i, status)
		}
		homes[backendNames(t, reps[i%3].inst.AdminAddr)[be]]++
	}
	if len(homes) != 1 {
		t.Errorf("one session through three replicas went to %v, want one server", homes)
	}

	// Redis killed mid-run: every request is answered, each replica says
	// it is alone; restarted, they rejoin by themselves and bravo's limit
	// is the fleet's again.
	for i := range 30 {
		if i == 10 {
			r.Kill()
		}
		if status, _, _ := fleetPost(t, reps[i%3].inst.Addr, testKeyC, ""); status != http.StatusOK {
			t.Fatalf("request %d, Redis killed after the tenth: %d", i, status)
		}
	}
	for _, rep := range reps {
		if !waitFor(10*time.Second, func() bool { return !clusterUp(t, rep.inst.AdminAddr) }) {
			t.Fatal("a replica still reports Redis up 10s after it was killed")
		}
	}
	if page := statusPage(t, reps[0].inst.AdminAddr); !strings.Contains(page, "Redis down") {
		t.Errorf("the status page does not say Redis is down")
	}
	r.Restart()
	for _, rep := range reps {
		if !waitFor(10*time.Second, func() bool { return clusterUp(t, rep.inst.AdminAddr) }) {
			t.Fatal("a replica did not rejoin Redis within 10s of its restart")
		}
	}
	if page := statusPage(t, reps[0].inst.AdminAddr); !strings.Contains(page, "fleet state in Redis") {
		t.Errorf("the status page does not say the fleet state is in Redis")
	}
	if got := admitted(t, reps, testKeyB, 9); got != 3 {
		t.Errorf("after Redis came back: 9 requests at 3 a minute over three replicas, %d admitted, want 3", got)
	}

	// A replica restarts: it finds the session's home and the limit where
	// the fleet left them.
	for i := range 3 {
		if status, _, _ := fleetPost(t, reps[i].inst.Addr, testKeyC, "conversation-8"); status != http.StatusOK {
			t.Fatalf("conversation-8 request %d: %d", i, status)
		}
	}
	_, before, _ := fleetPost(t, reps[0].inst.Addr, testKeyC, "conversation-8")
	beforeURL := backendNames(t, reps[0].inst.AdminAddr)[before]
	reps[0].stop()
	reps[0] = startReplica(t, cfg, 3)
	if !waitFor(10*time.Second, func() bool { return clusterUp(t, reps[0].inst.AdminAddr) }) {
		t.Fatal("the restarted replica did not join Redis within 10s")
	}
	_, after, _ := fleetPost(t, reps[0].inst.Addr, testKeyC, "conversation-8")
	if got := backendNames(t, reps[0].inst.AdminAddr)[after]; got != beforeURL {
		t.Errorf("after the replica restarted, the session went to %s, want its home %s", got, beforeURL)
	}
	if status, _, retry := fleetPost(t, reps[0].inst.Addr, testKeyB, ""); status != http.StatusTooManyRequests || retry == "" {
		t.Errorf("bravo, spent, through the restarted replica: %d (Retry-After %q), want 429", status, retry)
	}
}

// With cluster.limits_when_down: refuse, a limited key's requests are
// refused with 503 and Retry-After while Redis is down, in OpenAI's
// shape; a key without limits is answered; once Redis is back, the
// limited key is admitted again.
func TestLimitsRefusedWhileRedisIsDown(t *testing.T) {
	r := redistest.Start(t)
	urls := simBackends(t, 1, sim.SteadyConfig{Speed: 100, DecodeTokensPerSecond: 2000})
	cfg := fleetConfig(urls, r.Addr)
	cfg.Cluster.LimitsWhenDown = "refuse"
	rep := startReplica(t, cfg, 1)
	if !waitFor(10*time.Second, func() bool { return clusterUp(t, rep.inst.AdminAddr) }) {
		t.Fatal("the replica did not join Redis within 10s")
	}
	r.Kill()
	if !waitFor(10*time.Second, func() bool { return !clusterUp(t, rep.inst.AdminAddr) }) {
		t.Fatal("the replica still reports Redis up 10s after it was killed")
	}
	if status, _, retry := fleetPost(t, rep.inst.Addr, testKeyA, ""); status != http.StatusServiceUnavailable || retry == "" {
		t.Errorf("a limited key with Redis down: %d (Retry-After %q), want 503 with Retry-After", status, retry)
	}
	if status, _, _ := fleetPost(t, rep.inst.Addr, testKeyC, ""); status != http.StatusOK {
		t.Errorf("a key without limits with Redis down: %d, want 200", status)
	}
	r.Restart()
	if !waitFor(10*time.Second, func() bool { return clusterUp(t, rep.inst.AdminAddr) }) {
		t.Fatal("the replica did not rejoin Redis within 10s")
	}
	if status, _, _ := fleetPost(t, rep.inst.Addr, testKeyA, ""); status != http.StatusOK {
		t.Errorf("the limited key once Redis is back: %d, want 200", status)
	}
}
