package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
)

// TestRouteNamesBackendsAsTheHeaderDoes: /debug/route names every backend
// as x-llmlb-backend does, beside its URL, whether it would be chosen, is
// down or serves another model, so that an operator can match the dry run
// to what clients see (issue 42).
func TestRouteNamesBackendsAsTheHeaderDoes(t *testing.T) {
	up, down := okBackend(t, nil), okBackend(t, nil)
	const other = "http://other.invalid"
	spec := func(id, name string, state balancer.State, model string) balancer.Spec {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		return balancer.Spec{ID: id, Name: name, URL: u, Engine: "vllm", Models: []string{model}, State: state,
			Metrics: balancer.Metrics{Queued: balancer.Known(0), Running: balancer.Known(0), KVUsage: balancer.Known(0.1), At: time.Now()}}
	}
	bal := newBal(t, balancer.DefaultConfig().Policy)
	bal.Update(spec(up.URL, "gpu-0", balancer.StateReady, testModel), spec(down.URL, "", balancer.StateDown, testModel),
		spec(other, "", balancer.StateReady, "other-model"))
	names := map[string]string{} // URL -> name
	for _, be := range bal.Snapshot().Backends {
		names[be.ID] = be.Name
	}
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()})

	rec := httptest.NewRecorder()
	s.AdminHandler(prometheus.NewRegistry()).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/route", strings.NewReader(completion(testModel))))
	if rec.Code != http.StatusOK {
		t.Fatalf("POST /debug/route: %d %s", rec.Code, rec.Body)
	}
	var route struct {
		Explanation struct {
			Backends    []map[string]any `json:"backends"`
			Chosen      []string         `json:"chosen"`
			ChosenNames []string         `json:"chosen_names"`
		} `json:"explanation"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &route); err != nil {
		t.Fatal(err)
	}
	ex := route.Explanation
	if len(ex.Backends) != 3 || len(ex.Chosen) != 1 || ex.Chosen[0] != up.URL {
		t.Fatalf("explanation: %d backends, chosen %v; want 3, %s:\n%s", len(ex.Backends), ex.Chosen, up.URL, rec.Body)
	}
	for _, b := range ex.Backends {
		id, _ := b["id"].(string)
		if name, ok := b["name"].(string); !ok || name != names[id] || names[id] == "" {
			t.Errorf("backend %q is named %v, want %q", id, b["name"], names[id])
		}
	}

	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(completion(testModel))))
	if got := rec.Header().Get(HeaderBackend); rec.Code != http.StatusOK || got != "gpu-0" || len(ex.ChosenNames) != 1 || ex.ChosenNames[0] != got {
		t.Errorf("the request went to %s %q (status %d); /debug/route chose %v", HeaderBackend, got, rec.Code, ex.ChosenNames)
	}
}
