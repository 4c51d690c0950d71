package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/balancer"
)

// TestRankHeaderIsPerAttempt: a request to a data-parallel rank carries
// X-data-parallel-rank with its global rank; when that rank answers 429
// and the request goes to a backend without ranks, the retry carries no
// rank header, since attempts share the request's header map.
func TestRankHeaderIsPerAttempt(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // by server: the rank header of each attempt
	record := func(name string, status int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			seen[name] = append(seen[name], r.Header.Get("X-data-parallel-rank"))
			mu.Unlock()
			if status != http.StatusOK {
				w.Header().Set("Retry-After", "1")
				http.Error(w, `{"error":{"message":"overloaded"}}`, status)
				return
			}
			io.WriteString(w, `{"choices":[]}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	ranked := record("ranked", http.StatusTooManyRequests)
	plain := record("plain", http.StatusOK)
	f := newFront(t, DefaultConfig(), plain.URL)
	u, err := url.Parse(ranked.URL)
	if err != nil {
		t.Fatal(err)
	}
	id := balancer.RankID(ranked.URL, 5)
	f.bal.Update(balancer.Spec{ID: id, URL: u, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady, Ranked: true, Rank: 5})
	preferFirst(t, f.bal, id)

	resp, err := http.Post(f.URL+"/v1/completions", "application/json", strings.NewReader(body("completion", "")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200 from the second backend", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(seen["ranked"], ","); got != "5" {
		t.Errorf("rank 5 saw X-data-parallel-rank %q, want 5", got)
	}
	if got := seen["plain"]; len(got) != 1 || got[0] != "" {
		t.Errorf("the backend without ranks saw X-data-parallel-rank %q, want one attempt without it", got)
	}
	if name := backendOf(t, f.bal, id).Name; !strings.HasSuffix(name, "/r5") {
		t.Errorf("rank backend named %q, want <server>/r5", name)
	}
}
