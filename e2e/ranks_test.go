package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// rankServer is an emulated server running data-parallel ranks start to
// start+size-1 behind one port, which records the X-data-parallel-rank of
// every generation it is sent, by the prompt's group (the text before the
// first '|').
type rankServer struct {
	URL string

	mu     sync.Mutex
	ranks  map[string][]string // guarded by mu; by group, in arrival order
	counts int                 // guarded by mu; generations seen
}

// newRankServer starts an emulated vLLM rankServer.
func newRankServer(t *testing.T, start, size int) *rankServer {
	t.Helper()
	return newEngineRankServer(t, "vllm", start, size)
}

// newEngineRankServer starts a rankServer of the engine flavour.
func newEngineRankServer(t *testing.T, engine string, start, size int) *rankServer {
	t.Helper()
	models := make([]sim.Model, size)
	for i := range models {
		models[i] = sim.NewSteady(sim.SteadyConfig{Speed: 20, MaxRunning: 64})
	}
	s, err := sim.NewDataParallelServer(sim.ServerConfig{Engine: engine, Model: testModel, DataParallelStartRank: start}, models)
	if err != nil {
		t.Fatal(err)
	}
	rs := &rankServer{ranks: map[string][]string{}}
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			_, group, _ := strings.Cut(string(body), `"prompt":"`)
			group, _, _ = strings.Cut(group, "|")
			rs.mu.Lock()
			rs.ranks[group] = append(rs.ranks[group], r.Header.Get("X-data-parallel-rank"))
			rs.counts++
			rs.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rs.URL = srv.URL
	return rs
}

// TestDataParallelRanksEndToEnd is issue 45's must-hold for ranks:
// against one server publishing ranks 4-7, every request llmlb forwards
// carries an X-data-parallel-rank between 4 and 7, a prompt group keeps
// its rank, and distinct groups spread over at least three ranks. The
// ranks are detected from the engine label of the metrics page, or set
// with data_parallel_size and data_parallel_start_rank.
func TestDataParallelRanksEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size, from int
	}{
		{name: "detected"},
		{name: "configured", size: 4, from: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := newRankServer(t, 4, 4)
			cfg := testConfig(nil)
			cfg.Backends = []scrape.BackendConfig{{URL: rs.URL, Name: "node2", DataParallelSize: tc.size, DataParallelStartRank: tc.from}}
			inst := startTest(t, cfg, 4)
			waitFresh(t, inst.AdminAddr, 4)

			checkRankBackends(t, inst.AdminAddr, rs.URL, "node2/r4", "node2/r5", "node2/r6", "node2/r7")
			checkRankAffinity(t, inst.Addr, rs, 4, 7)
		})
	}
}

// checkRankAffinity sends 8 prompt groups 4 rounds each through the
// balancer at addr and checks what rs saw: every request carried an
// X-data-parallel-rank from first to last, a group kept its rank, and
// the groups spread over at least three ranks.
func checkRankAffinity(t *testing.T, addr string, rs *rankServer, first, last int) {
	t.Helper()
	const groups, rounds = 8, 4
	for round := range rounds {
		var bodies []string
		for g := range groups {
			system := strings.Repeat(fmt.Sprintf("You are assistant number %d of the support desk. ", g), 300)
			bodies = append(bodies, completion(fmt.Sprintf("group%d|%s\nQuestion %d?", g, system, round), 4))
		}
		fire(t, addr, bodies, groups)
	}

	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.counts != groups*rounds {
		t.Errorf("server saw %d generations, want %d", rs.counts, groups*rounds)
	}
	used := map[string]bool{}
	for g, ranks := range rs.ranks {
		for _, r := range ranks {
			if n, err := strconv.Atoi(r); err != nil || n < first || n > last {
				t.Errorf("%s: a request carried X-data-parallel-rank %q, want %d to %d", g, r, first, last)
			}
		}
		if slices.ContainsFunc(ranks, func(r string) bool { return r != ranks[0] }) {
			t.Errorf("%s went to ranks %v, want one rank", g, ranks)
		}
		used[ranks[0]] = true
	}
	if len(used) < 3 {
		t.Errorf("%d groups used ranks %v, want at least 3 ranks", groups, used)
	}
	t.Logf("ranks by group: %v", rs.ranks)
}

// TestSGLangDataParallelRanksEndToEnd is the same must-hold against one
// emulated SGLang server of ranks 0-3 (sglang --dp-size 4): its ranks are
// detected from the dp_rank label of its scheduler gauges, each request
// carries X-data-parallel-rank between 0 and 3, which SGLang reads on its
// OpenAI routes, a prompt group keeps its rank, and distinct groups spread
// over at least three ranks.
func TestSGLangDataParallelRanksEndToEnd(t *testing.T) {
	rs := newEngineRankServer(t, "sglang", 0, 4)
	cfg := testConfig(nil)
	cfg.Backends = []scrape.BackendConfig{{URL: rs.URL, Name: "sgl", Engine: "sglang"}}
	inst := startTest(t, cfg, 4)
	waitFresh(t, inst.AdminAddr, 4)

	checkRankBackends(t, inst.AdminAddr, rs.URL, "sgl/r0", "sgl/r1", "sgl/r2", "sgl/r3")
	checkRankAffinity(t, inst.Addr, rs, 0, 3)
}

// TestOneEngineServerGetsNoRankHeader: a server whose metrics show one
// engine is one backend, and llmlb sends it no X-data-parallel-rank.
func TestOneEngineServerGetsNoRankHeader(t *testing.T) {
	rs := newRankServer(t, 0, 1)
	cfg := testConfig([]string{rs.URL})
	inst := startTest(t, cfg, 1)
	waitFresh(t, inst.AdminAddr, 1)
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].ID != rs.URL || bs[0].Rank != nil {
		t.Fatalf("/debug/backends = %+v, want the one server without a rank", bs)
	}
	fire(t, inst.Addr, []string{completion("groupA|hello", 2), completion("groupB|hello", 2)}, 2)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for g, ranks := range rs.ranks {
		for _, r := range ranks {
			if r != "" {
				t.Errorf("%s: request carried X-data-parallel-rank %q, want none", g, r)
			}
		}
	}
	if rs.counts != 2 {
		t.Errorf("server saw %d generations, want 2", rs.counts)
	}
}

// rankPublishers starts one KV-event publisher per rank of n, as vLLM's
// ranks publish: rank r on base port + r, its replay socket on replay
// base + r. It returns the base endpoints.
func rankPublishers(t *testing.T, n, blockSize int) (pubs []*sim.KVPublisher, endpoint, replay string) {
	t.Helper()
	free := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	for range 20 { // a port taken meanwhile: try other bases
		ep, rp := free(), free()
		if ep+n > 65535 || rp+n > 65535 || (rp < ep+n && ep < rp+n) {
			continue
		}
		ctx, cancel := context.WithCancel(t.Context())
		pubs = pubs[:0]
		ok := true
		for r := range n {
			p, err := sim.NewKVPublisher(ctx, "127.0.0.1:"+strconv.Itoa(ep+r), "127.0.0.1:"+strconv.Itoa(rp+r), blockSize)
			if err != nil {
				ok = false
				break
			}
			pubs = append(pubs, p)
		}
		if ok {
			t.Cleanup(cancel)
			return pubs, "tcp://127.0.0.1:" + strconv.Itoa(ep), "tcp://127.0.0.1:" + strconv.Itoa(rp)
		}
		cancel()
	}
	t.Fatal("no free consecutive ports")
	return nil, "", ""
}

// TestRankKVEventsFollowedPerRank: a server of four ranks whose engines
// publish KV events on consecutive ports, as vLLM's do, is followed rank
// by rank: what each rank caches arrives at that rank's backend.
func TestRankKVEventsFollowedPerRank(t *testing.T) {
	ecfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	pubs, ep, rp := rankPublishers(t, n, ecfg.BlockSize)
	ranks := make([]sim.Model, n)
	for i := range ranks {
		live := sim.NewLive(ecfg, 100)
		live.PublishKV(pubs[i])
		ranks[i] = live
	}
	s, err := sim.NewDataParallelServer(sim.ServerConfig{Model: testModel}, ranks)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	cfg := testConfig(nil)
	cfg.Backends = []scrape.BackendConfig{{URL: srv.URL, DataParallelSize: n, KVEvents: ep, KVEventsReplay: rp}}
	inst := startTest(t, cfg, n)

	// Each rank is sent documents until its blocks arrive: a subscriber
	// misses what was published before it connected until a later batch
	// makes it ask for the replay.
	sent := 0
	if !waitFor(time.Minute, func() bool {
		ss := scrapeAdmin(t, inst.AdminAddr)
		all := true
		for r := range n {
			if got, _ := sum(ss, "llmlb_kv_event_blocks", `backend="`+srv.URL+`#rank=`+strconv.Itoa(r)+`"`); got >= 1 {
				continue
			}
			all = false
			sent++
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions",
				strings.NewReader(completion(strings.Repeat(fmt.Sprintf("rank %d holds document %d; ", r, sent), 100), 2)))
			req.Header.Set("X-data-parallel-rank", strconv.Itoa(r))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return all
	}) {
		t.Errorf("not every rank's blocks arrived at its backend: %v", scrapeAdmin(t, inst.AdminAddr)["llmlb_kv_event_blocks"])
	}
}

// checkRankBackends: /debug/backends lists one backend per rank of the
// server at url, with ID <url>#rank=<rank>, named want in order.
func checkRankBackends(t *testing.T, adminAddr, url string, want ...string) {
	t.Helper()
	bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+adminAddr)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range bs {
		if b.Rank == nil || b.ID != url+"#rank="+strconv.Itoa(*b.Rank) {
			t.Errorf("/debug/backends: %s with rank %v, want %s#rank=<rank>", b.ID, b.Rank, url)
		}
		names = append(names, b.Name)
	}
	if !slices.Equal(names, want) {
		t.Errorf("backend names %v, want %v", names, want)
	}
}
