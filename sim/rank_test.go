package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// rankedServer is an emulated vLLM serving ranks 4-7 behind one port.
func rankedServer(t *testing.T) *httptest.Server {
	t.Helper()
	ranks := make([]Model, 4)
	for i := range ranks {
		ranks[i] = NewSteady(SteadyConfig{Speed: 1000})
	}
	s, err := NewDataParallelServer(ServerConfig{Model: "m", DataParallelStartRank: 4}, ranks)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// promptTokensByEngine reads vllm:prompt_tokens_total by engine label.
func promptTokensByEngine(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range fams["vllm:prompt_tokens_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "engine" {
				out[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func rankRequest(t *testing.T, url, rank string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if rank != "" {
		req.Header.Set("X-data-parallel-rank", rank)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestRankHeaderPinsTheEngine: a request with X-data-parallel-rank runs
// on that rank's engine, which its engine-labelled metrics show.
func TestRankHeaderPinsTheEngine(t *testing.T) {
	srv := rankedServer(t)
	if got := promptTokensByEngine(t, srv.URL); len(got) != 4 {
		t.Fatalf("metrics engines %v, want 4 to 7", got)
	}
	resp := rankRequest(t, srv.URL, "6")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	for engine, v := range promptTokensByEngine(t, srv.URL) {
		if (v > 0) != (engine == "6") {
			t.Errorf("prompt tokens on engine %s: %g; want them on engine 6 alone", engine, v)
		}
	}
}

// TestRankOutOfRangeRefused: a rank the server does not run is a 400 in
// vLLM's words; a header that is not a number is ignored, as vLLM
// ignores it.
func TestRankOutOfRangeRefused(t *testing.T) {
	srv := rankedServer(t)
	for _, tc := range []struct {
		rank       string
		wantStatus int
		wantMsg    string
	}{
		{rank: "3", wantStatus: 400, wantMsg: "data_parallel_rank 3 is out of range [4, 8)."},
		{rank: "8", wantStatus: 400, wantMsg: "data_parallel_rank 8 is out of range [4, 8)."},
		{rank: "seven", wantStatus: 200},
		{rank: "7", wantStatus: 200},
	} {
		resp := rankRequest(t, srv.URL, tc.rank)
		var body struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != tc.wantStatus || body.Error.Message != tc.wantMsg {
			t.Errorf("rank %q: %d %q, want %d %q", tc.rank, resp.StatusCode, body.Error.Message, tc.wantStatus, tc.wantMsg)
		}
	}
}

// TestNoRankHeaderSpreads: without the header the server spreads requests
// over its ranks itself, as vLLM's DP coordinator does.
func TestNoRankHeaderSpreads(t *testing.T) {
	srv := rankedServer(t)
	for i := range 8 {
		resp := rankRequest(t, srv.URL, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	for engine, v := range promptTokensByEngine(t, srv.URL) {
		if v == 0 {
			t.Errorf("engine %s got no request of 8", engine)
		}
	}
}

func TestDataParallelServerRefusesOtherEngines(t *testing.T) {
	for _, engine := range []string{"sglang", "triton-tensorrt-llm", "trtllm-serve"} {
		_, err := NewDataParallelServer(ServerConfig{Engine: engine, Model: "m"}, []Model{NewSteady(SteadyConfig{}), NewSteady(SteadyConfig{})})
		if err == nil {
			t.Errorf("%s: two ranks accepted", engine)
		}
	}
}
