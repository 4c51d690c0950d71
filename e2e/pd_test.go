package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// pdLegs records the generation requests emulated servers receive.
type pdLegs struct {
	mu   sync.Mutex
	legs []pdRecord
}

type pdRecord struct {
	server    string
	requestID string
	body      map[string]any
	answer    map[string]any // a JSON answer, nil for a stream
}

// wrap records each generation request h receives, and its JSON answer.
func (p *pdLegs) wrap(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/completions") {
			h.ServeHTTP(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		rec := pdRecord{server: name, requestID: r.Header.Get("X-Request-Id")}
		_ = json.Unmarshal(b, &rec.body)
		tw := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(tw, r)
		_ = json.Unmarshal(tw.buf.Bytes(), &rec.answer)
		p.mu.Lock()
		p.legs = append(p.legs, rec)
		p.mu.Unlock()
	})
}

// teeWriter keeps a copy of what is written, and flushes as it goes.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (t *teeWriter) Write(b []byte) (int, error) {
	t.buf.Write(b)
	return t.ResponseWriter.Write(b)
}

func (t *teeWriter) Flush() { t.ResponseWriter.(http.Flusher).Flush() }

// pdFleet starts two prefill and two decode emulated servers of engine
// (vllm or sglang, which share one bootstrap registry) and llmlb in front
// of them, the servers declared by role.
func pdFleet(t *testing.T, engine string) (base string, legs *pdLegs, servers map[string]*sim.Server) {
	t.Helper()
	legs = &pdLegs{}
	servers = map[string]*sim.Server{}
	rooms := sim.NewRooms()
	var backends []scrape.BackendConfig
	for _, role := range []string{"prefill", "prefill", "decode", "decode"} {
		name := fmt.Sprintf("%s%d", role, len(backends))
		s, err := sim.NewServer(sim.ServerConfig{Engine: engine, Model: testModel, PD: sim.PDConfig{Role: role, Rooms: rooms}}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(legs.wrap(name, s.Handler()))
		t.Cleanup(srv.Close)
		servers[name] = s
		backends = append(backends, scrape.BackendConfig{URL: srv.URL, Name: name, Engine: engine, Role: role})
	}
	cfg := testConfig(nil)
	cfg.Backends = backends
	inst := startTest(t, cfg, 4)
	return "http://" + inst.Addr, legs, servers
}

// longChat is a chat long enough for a prefill leg, distinct per i so
// that no decode server holds it already.
func longChat(i int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":8,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Request %d. %s"}]}`,
		testModel, stream, i, strings.Repeat("Summarise the attached quarterly report section by section. ", 60))
}

// TestPDvLLMTwoLegs is issue 45's must-hold for vLLM: with two prefill
// and two decode servers declared by role, long chats answer 200; every
// prefill leg carries do_remote_decode, stream false and max_tokens 1;
// every decode leg the kv_transfer_params its prefill leg returned and
// the same X-Request-Id; streamed requests stream.
func TestPDvLLMTwoLegs(t *testing.T) {
	base, legs, _ := pdFleet(t, "vllm")
	for i := range 6 {
		stream := i%2 == 0
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(longChat(i, stream)))
		if err != nil {
			t.Fatal(err)
		}
		events := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				events++
			}
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(proxy.HeaderPrefillBackend) == "" {
			t.Fatalf("request %d: status %d, prefill backend %q", i, resp.StatusCode, resp.Header.Get(proxy.HeaderPrefillBackend))
		}
		if stream && events < 9 { // role, 8 tokens, usage, [DONE]
			t.Errorf("request %d: %d events, want a stream", i, events)
		}
	}
	legs.mu.Lock()
	defer legs.mu.Unlock()
	prefilled := map[string]map[string]any{} // request id -> its prefill answer's kv_transfer_params
	decoded := 0
	for _, l := range legs.legs {
		if strings.HasPrefix(l.server, "prefill") {
			kv, _ := l.body["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || l.body["stream"] != false || l.body["max_tokens"] != float64(1) {
				t.Errorf("prefill leg %s: kv_transfer_params %v, stream %v, max_tokens %v", l.requestID, kv, l.body["stream"], l.body["max_tokens"])
			}
			prefilled[l.requestID], _ = l.answer["kv_transfer_params"].(map[string]any)
		}
	}
	for _, l := range legs.legs {
		if strings.HasPrefix(l.server, "decode") {
			decoded++
			want, ok := prefilled[l.requestID]
			got, _ := l.body["kv_transfer_params"].(map[string]any)
			if !ok || want == nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("decode leg %s: kv_transfer_params %v, want its prefill leg's %v", l.requestID, got, want)
			}
		}
	}
	if len(prefilled) != 6 || decoded != 6 {
		t.Errorf("%d prefill and %d decode legs, want 6 each", len(prefilled), decoded)
	}
}

// TestPDShortPromptIsLocal: a short chat goes to a decode server alone.
func TestPDShortPromptIsLocal(t *testing.T) {
	base, legs, _ := pdFleet(t, "vllm")
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	legs.mu.Lock()
	defer legs.mu.Unlock()
	if resp.StatusCode != http.StatusOK || len(legs.legs) != 1 || !strings.HasPrefix(legs.legs[0].server, "decode") {
		t.Errorf("status %d, legs %v; want 200 from one decode server", resp.StatusCode, legs.legs)
	}
}

// TestPDSGLangBootstrap: against emulated SGLang servers both legs carry
// the same bootstrap fields and the decode leg's stream reaches the
// client; with the prefill servers failing, the request fails with a 502
// and its decode leg generates nothing (aborted, or failed by its room).
func TestPDSGLangBootstrap(t *testing.T) {
	base, legs, servers := pdFleet(t, "sglang")
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(longChat(0, true)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]") {
		t.Fatalf("status %d, body %.300s", resp.StatusCode, b)
	}
	legs.mu.Lock()
	if len(legs.legs) != 2 {
		t.Fatalf("legs = %d, want 2", len(legs.legs))
	}
	rooms := []any{legs.legs[0].body["bootstrap_room"], legs.legs[1].body["bootstrap_room"]}
	if rooms[0] == nil || rooms[0] != rooms[1] || legs.legs[0].body["bootstrap_port"] != float64(8998) {
		t.Errorf("bootstrap fields %v / %v", legs.legs[0].body, legs.legs[1].body)
	}
	legs.legs = nil
	legs.mu.Unlock()

	faults, err := sim.ParseFaults("5xx")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range servers {
		if strings.HasPrefix(name, "prefill") {
			s.SetFaults(faults)
		}
	}
	resp, err = http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(longChat(1, true)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "prefill_failed") {
		t.Errorf("with failing prefill servers: status %d, body %.300s; want 502 prefill_failed", resp.StatusCode, b)
	}
	legs.mu.Lock()
	defer legs.mu.Unlock()
	i := slices.IndexFunc(legs.legs, func(l pdRecord) bool { return strings.HasPrefix(l.server, "decode") })
	if i >= 0 && legs.legs[i].answer["choices"] != nil { // aborted, or failed by its room
		t.Errorf("the decode leg answered %v after its prefill failed", legs.legs[i].answer)
	}
}

// TestComposePDExample: the disaggregated compose example starts vLLM
// with NixlConnector on two GPUs, and its llmlb config declares those
// servers, at the ports they serve on, as prefill and decode.
func TestComposePDExample(t *testing.T) {
	docs := readYAML(t, "../examples/compose-pd.yaml")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	services, _ := docs[0]["services"].(map[string]any)
	ports := map[string]string{}
	for _, name := range []string{"vllm-prefill", "vllm-decode"} {
		svc, _ := services[name].(map[string]any)
		cmd := fmt.Sprint(svc["command"])
		if !strings.Contains(cmd, `--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both"}`) {
			t.Errorf("%s: command %s lacks the NixlConnector kv-transfer-config", name, cmd)
		}
		i := strings.Index(cmd, "--port=")
		if i < 0 {
			t.Fatalf("%s: no --port in %s", name, cmd)
		}
		ports[name] = strings.Fields(cmd[i+len("--port="):])[0]
	}
	b, err := os.ReadFile("../examples/compose/llmlb-pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadExampleConfig(t, "llmlb-pd.yaml", string(b))
	want := map[string]string{"prefill": "http://127.0.0.1:" + ports["vllm-prefill"], "decode": "http://127.0.0.1:" + ports["vllm-decode"]}
	for _, be := range cfg.Backends {
		if want[be.Role] != be.URL {
			t.Errorf("backend %s has role %q, want the %v", be.URL, be.Role, want)
		}
		delete(want, be.Role)
	}
	if len(want) != 0 {
		t.Errorf("no backend for %v", want)
	}
}
