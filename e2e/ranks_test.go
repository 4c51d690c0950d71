package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// rankServer is an emulated vLLM server running data-parallel ranks
// start to start+size-1 behind one port, which records the
// X-data-parallel-rank of every generation it is sent, by the prompt's
// group (the text before the first '|').
type rankServer struct {
	URL string

	mu     sync.Mutex
	ranks  map[string][]string // guarded by mu; by group, in arrival order
	counts int                 // guarded by mu; generations seen
}

func newRankServer(t *testing.T, start, size int) *rankServer {
	t.Helper()
	models := make([]sim.Model, size)
	for i := range models {
		models[i] = sim.NewSteady(sim.SteadyConfig{Speed: 20, MaxRunning: 64})
	}
	s, err := sim.NewDataParallelServer(sim.ServerConfig{Model: testModel, DataParallelStartRank: start}, models)
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

			bs, err := proxy.FetchBackends(http.DefaultClient, "http://"+inst.AdminAddr)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, b := range bs {
				if b.Rank == nil || b.ID != rs.URL+"#rank="+strconv.Itoa(*b.Rank) {
					t.Errorf("/debug/backends: %s with rank %v, want %s#rank=<rank>", b.ID, b.Rank, rs.URL)
				}
				names = append(names, b.Name)
			}
			if want := []string{"node2/r4", "node2/r5", "node2/r6", "node2/r7"}; !slices.Equal(names, want) {
				t.Errorf("backend names %v, want %v", names, want)
			}

			const groups, rounds = 8, 4
			for round := range rounds {
				var bodies []string
				for g := range groups {
					system := strings.Repeat(fmt.Sprintf("You are assistant number %d of the support desk. ", g), 300)
					bodies = append(bodies, completion(fmt.Sprintf("group%d|%s\nQuestion %d?", g, system, round), 4))
				}
				fire(t, inst.Addr, bodies, groups)
			}

			rs.mu.Lock()
			defer rs.mu.Unlock()
			if rs.counts != groups*rounds {
				t.Errorf("server saw %d generations, want %d", rs.counts, groups*rounds)
			}
			used := map[string]bool{}
			for g, ranks := range rs.ranks {
				for _, r := range ranks {
					if n, err := strconv.Atoi(r); err != nil || n < 4 || n > 7 {
						t.Errorf("%s: a request carried X-data-parallel-rank %q, want 4 to 7", g, r)
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
		})
	}
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
