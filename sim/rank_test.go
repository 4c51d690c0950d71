package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// rankedServer is an emulated server of the engine flavour serving ranks
// 4-7 behind one port.
func rankedServer(t *testing.T, engine string, sc SteadyConfig) *httptest.Server {
	t.Helper()
	ranks := make([]Model, 4)
	for i := range ranks {
		ranks[i] = NewSteady(sc)
	}
	s, err := NewDataParallelServer(ServerConfig{Engine: engine, Model: "m", DataParallelStartRank: 4}, ranks)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// metricsPage reads and parses url's /metrics.
func metricsPage(t *testing.T, url string) map[string]*dto.MetricFamily {
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
	return fams
}

// byRank reads the gauge or counter family from url's metrics page by the
// value of its rank label.
func byRank(t *testing.T, url, family, label string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range metricsPage(t, url)[family].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
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
	srv := rankedServer(t, "vllm", SteadyConfig{Speed: 1000})
	if got := byRank(t, srv.URL, "vllm:prompt_tokens_total", "engine"); len(got) != 4 {
		t.Fatalf("metrics engines %v, want 4 to 7", got)
	}
	resp := rankRequest(t, srv.URL, "6")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	for engine, v := range byRank(t, srv.URL, "vllm:prompt_tokens_total", "engine") {
		if (v > 0) != (engine == "6") {
			t.Errorf("prompt tokens on engine %s: %g; want them on engine 6 alone", engine, v)
		}
	}
}

// TestRankOutOfRangeRefused: a rank the server does not run is a 400 in
// vLLM's words; a header that is not a number is ignored, as vLLM
// ignores it.
func TestRankOutOfRangeRefused(t *testing.T) {
	srv := rankedServer(t, "vllm", SteadyConfig{Speed: 1000})
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
	srv := rankedServer(t, "vllm", SteadyConfig{Speed: 1000})
	for i := range 8 {
		resp := rankRequest(t, srv.URL, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	for engine, v := range byRank(t, srv.URL, "vllm:prompt_tokens_total", "engine") {
		if v == 0 {
			t.Errorf("engine %s got no request of 8", engine)
		}
	}
}

func TestDataParallelServerRefusesOtherEngines(t *testing.T) {
	for _, engine := range []string{"triton-tensorrt-llm", "trtllm-serve"} {
		_, err := NewDataParallelServer(ServerConfig{Engine: engine, Model: "m"}, []Model{NewSteady(SteadyConfig{}), NewSteady(SteadyConfig{})})
		if err == nil {
			t.Errorf("%s: two ranks accepted", engine)
		}
	}
}

// TestSGLangRankPage: an emulated SGLang server of ranks 4-7 labels each
// rank's scheduler gauges as SGLang's init_metrics does, dp_rank beside
// tp_rank and pp_rank, and its tokenizer's counters once for the server.
func TestSGLangRankPage(t *testing.T) {
	srv := rankedServer(t, "sglang", SteadyConfig{Speed: 1000})
	fams := metricsPage(t, srv.URL)
	for _, family := range []string{"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"} {
		var got []string
		for _, m := range fams[family].GetMetric() {
			got = append(got, labelString(m))
		}
		var want []string
		for r := 4; r <= 7; r++ {
			want = append(want, fmt.Sprintf("dp_rank=%d,engine_type=unified,model_name=m,pp_rank=0,tp_rank=0", r))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s series %q, want %q", family, got, want)
		}
	}
	if m := fams["sglang:prompt_tokens_total"].GetMetric(); len(m) != 1 || labelString(m[0]) != "model_name=m" {
		t.Errorf("sglang:prompt_tokens_total = %v, want one series labelled model_name", m)
	}
}

// labelString is m's labels, name=value sorted by name, comma separated.
func labelString(m *dto.Metric) string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName()+"="+l.GetValue())
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// TestSGLangRankHeaderPinsTheRank: a request with X-data-parallel-rank
// runs on that rank of an emulated SGLang server, which that rank's
// dp_rank series of num_running_reqs shows while the request runs.
func TestSGLangRankHeaderPinsTheRank(t *testing.T) {
	// The first token comes at once; the second only after the test ends
	// the request, so it is running while the page is read.
	srv := rankedServer(t, "sglang", SteadyConfig{Speed: 1000, DecodeTokensPerSecond: 1e-6})
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-data-parallel-rank", "6")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v; want the first token's event", line, err)
	}
	want := map[string]float64{"4": 0, "5": 0, "6": 1, "7": 0}
	if got := byRank(t, srv.URL, "sglang:num_running_reqs", "dp_rank"); !maps.Equal(got, want) {
		t.Errorf("running by dp_rank %v, want %v", got, want)
	}
}
