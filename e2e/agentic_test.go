package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/serve"
	"github.com/llmlb/llmlb/proxy"
	"github.com/llmlb/llmlb/sim"
)

// storeBackends starts n emulated vLLM servers that store responses in
// memory, as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1, and
// returns them (to be closed by a test) with their URLs.
func storeBackends(t *testing.T, n int) ([]*httptest.Server, []string) {
	t.Helper()
	var srvs []*httptest.Server
	var urls []string
	for range n {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{Speed: 100}))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		srvs = append(srvs, srv)
		urls = append(urls, srv.URL)
	}
	return srvs, urls
}

// call sends a JSON request and returns the status, the body and the
// answering backend's name.
func call(t *testing.T, method, url string, body any, header ...string) (int, []byte, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get(proxy.HeaderBackend)
}

// TestStoredResponsesFollowTheirServer: two llmlb replicas that share
// nothing, in front of three servers that each keep their responses in
// memory. Eight conversations start at once and go on turn by turn through
// the replicas in turn: every follow-up reaches the server that stores its
// previous response, as do GET and DELETE by id; a follow-up whose server
// is down gets an error that says so.
func TestStoredResponsesFollowTheirServer(t *testing.T) {
	srvs, urls := storeBackends(t, 3)
	insts := []*serve.Instance{startTest(t, testConfig(urls), 3), startTest(t, testConfig(urls), 3)}
	replicas := []string{"http://" + insts[0].Addr, "http://" + insts[1].Addr}
	type response struct {
		ID                 string `json:"id"`
		PreviousResponseID string `json:"previous_response_id"`
	}
	const conversations, followUps = 8, 3
	ids := make([][]string, conversations)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for c := range conversations {
		wg.Go(func() {
			prev := ""
			for i := range followUps + 1 {
				body := map[string]any{"model": testModel, "input": fmt.Sprintf("conversation %d, turn %d", c, i), "max_output_tokens": 4}
				if prev != "" {
					body["previous_response_id"] = prev
				}
				status, b, _ := call(t, "POST", replicas[(c+i)%2]+"/v1/responses", body)
				var r response
				if status != http.StatusOK || json.Unmarshal(b, &r) != nil || r.ID == "" || r.PreviousResponseID != prev && prev != "" {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("conversation %d turn %d: %d %s", c, i, status, b))
					mu.Unlock()
					return
				}
				prev = r.ID
				ids[c] = append(ids[c], r.ID)
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d turns failed:\n%s", len(failures), conversations*(followUps+1), strings.Join(failures, "\n"))
	}

	// Look-ups by id, each through the replica that did not make it.
	for c := range conversations {
		last := ids[c][len(ids[c])-1]
		if status, b, _ := call(t, "GET", replicas[c%2]+"/v1/responses/"+last, nil); status != http.StatusOK || !bytes.Contains(b, []byte(`"`+last+`"`)) {
			t.Errorf("GET %s: %d %s", last, status, b)
		}
		if status, b, _ := call(t, "GET", replicas[c%2]+"/v1/responses/"+last+"/input_items", nil); status != http.StatusOK {
			t.Errorf("GET %s/input_items: %d %s", last, status, b)
		}
	}
	first := ids[0][0]
	if status, b, _ := call(t, "DELETE", replicas[1]+"/v1/responses/"+first, nil); status != http.StatusOK || !bytes.Contains(b, []byte(`"`+first+`"`)) {
		t.Errorf("DELETE: %d %s", status, b)
	}
	if status, b, _ := call(t, "GET", replicas[0]+"/v1/responses/"+first, nil); status != http.StatusNotFound {
		t.Errorf("GET after DELETE: %d %s", status, b)
	}

	// A new llmlb, its backends listed the other way round (a restart and
	// a reload that reorders them), reads the same servers from the ids.
	rev := slices.Clone(urls)
	slices.Reverse(rev)
	fresh := "http://" + startTest(t, testConfig(rev), 3).Addr
	for c := range conversations {
		last := ids[c][len(ids[c])-1]
		status, b, _ := call(t, "POST", fresh+"/v1/responses", map[string]any{"model": testModel, "input": "one more", "previous_response_id": last, "max_output_tokens": 2})
		var r response
		if status != http.StatusOK || json.Unmarshal(b, &r) != nil || r.PreviousResponseID != last {
			t.Errorf("follow-up through a restarted llmlb with its backends reordered: %d %s", status, b)
		}
	}

	// A background response, polled through the other replica until done.
	status, b, _ := call(t, "POST", replicas[0]+"/v1/responses", map[string]any{"model": testModel, "input": "work on it", "background": true, "max_output_tokens": 3})
	var bg struct{ ID, Status string }
	if status != http.StatusOK || json.Unmarshal(b, &bg) != nil || bg.ID == "" {
		t.Fatalf("background: %d %s", status, b)
	}
	if !waitFor(10*time.Second, func() bool {
		status, b, _ := call(t, "GET", replicas[1]+"/v1/responses/"+bg.ID, nil)
		return status == http.StatusOK && json.Unmarshal(b, &bg) == nil && bg.Status != "queued" && bg.Status != "in_progress"
	}) {
		t.Errorf("background response %s never finished: %+v", bg.ID, bg)
	}
	// Cancelling it once done: the server's own 400, through llmlb.
	if status, b, _ := call(t, "POST", replicas[1]+"/v1/responses/"+bg.ID+"/cancel", nil); status != http.StatusBadRequest {
		t.Errorf("cancel of a finished response: %d %s", status, b)
	}

	// An id llmlb did not hand out leads nowhere: a 404 that says so.
	status, b, _ = call(t, "POST", replicas[0]+"/v1/responses", map[string]any{"model": testModel, "input": "x", "previous_response_id": "resp_0123"})
	if status != http.StatusNotFound || !bytes.Contains(b, []byte("not handed out by this load balancer")) {
		t.Errorf("untagged id: %d %s", status, b)
	}

	// The server storing conversation 1 goes down: its follow-up is told
	// so, by either replica, and is sent nowhere else.
	last := ids[1][len(ids[1])-1]
	_, _, name := call(t, "GET", replicas[0]+"/v1/responses/"+last, nil)
	url := backendNames(t, insts[0].AdminAddr)[name]
	for _, srv := range srvs {
		if srv.URL == url {
			srv.Close()
		}
	}
	for i, inst := range insts {
		waitBackend(t, inst.AdminAddr, url, "down", func(b proxy.BackendStatus) bool { return b.State == balancer.StateDown })
		status, b, _ := call(t, "POST", replicas[i]+"/v1/responses", map[string]any{"model": testModel, "input": "and then?", "previous_response_id": last})
		var e struct {
			Error struct{ Message, Code string }
		}
		if status != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e.Error.Code != "response_server_unavailable" || !strings.Contains(e.Error.Message, "which is down") {
			t.Errorf("follow-up on a server that is down, replica %d: %d %s", i, status, b)
		}
	}
}

// TestMessagesEndToEnd: Anthropic's Messages API through llmlb. Requests
// that share a long system prompt go to one server; a streamed Message
// arrives as Anthropic's events; a keyed llmlb takes the key in x-api-key
// and refuses a wrong one in Anthropic's error shape.
func TestMessagesEndToEnd(t *testing.T) {
	_, urls := storeBackends(t, 3)
	cfg := testConfig(urls)
	cfg.Auth = proxy.AuthConfig{Keys: []proxy.KeyConfig{{Name: "alpha", Key: proxy.HashKey(testKeyA)}}}
	inst := startTest(t, cfg, 3)
	base := "http://" + inst.Addr
	system := strings.Repeat("You are the support agent of a large shop; answer from the catalogue below. ", 60)

	seen := map[string]int{}
	for i := range 20 {
		status, b, name := call(t, "POST", base+"/v1/messages", map[string]any{
			"model": testModel, "max_tokens": 4, "system": system,
			"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("Customer %d asks about order %d.", i, 1000+i)}},
		}, "x-api-key", testKeyA, "anthropic-version", "2023-06-01")
		var m struct {
			Type  string
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if status != http.StatusOK || json.Unmarshal(b, &m) != nil || m.Type != "message" || m.Usage.OutputTokens != 4 {
			t.Fatalf("message %d: %d %s", i, status, b)
		}
		seen[name]++
	}
	if len(seen) != 1 {
		t.Errorf("20 messages on one system prompt went to %d servers: %v", len(seen), seen)
	}

	// Streamed: Anthropic's events, in their order.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/v1/messages", strings.NewReader(
		`{"model":"`+testModel+`","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("x-api-key", testKeyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			if len(events) == 0 || events[len(events)-1] != ev {
				events = append(events, ev)
			}
		}
	}
	resp.Body.Close()
	want := "message_start content_block_start content_block_delta content_block_stop message_delta message_stop"
	if resp.StatusCode != http.StatusOK || strings.Join(events, " ") != want {
		t.Errorf("stream: %d, events %v; want %s", resp.StatusCode, events, want)
	}

	// A wrong key: 401 in Anthropic's shape.
	status, b, _ := call(t, "POST", base+"/v1/messages", map[string]any{"model": testModel, "max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": "hi"}}},
		"x-api-key", testKeyB)
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if status != http.StatusUnauthorized || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "authentication_error" {
		t.Errorf("wrong x-api-key: %d %s", status, b)
	}
}

// TestStatelessResponsesFollowTheirPrefix: a conversation that resends its
// whole input each turn (store false) stays on the server that holds its
// prefix, as a chat does.
func TestStatelessResponsesFollowTheirPrefix(t *testing.T) {
	_, urls := storeBackends(t, 3)
	base := "http://" + startTest(t, testConfig(urls), 3).Addr
	input := []map[string]any{{"role": "user", "content": strings.Repeat("Summarise the attached design document section by section. ", 40)}}
	first := ""
	for turn := range 6 {
		status, b, name := call(t, "POST", base+"/v1/responses", map[string]any{
			"model": testModel, "store": false, "instructions": "You are a careful reviewer.", "input": input, "max_output_tokens": 4,
		})
		var r struct {
			Output []struct {
				Content []struct{ Text string }
			}
		}
		if status != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Output) == 0 || len(r.Output[0].Content) == 0 {
			t.Fatalf("turn %d: %d %s", turn, status, b)
		}
		if turn == 0 {
			first = name
		} else if name != first {
			t.Errorf("turn %d went to %s, the conversation's prefix is on %s", turn, name, first)
		}
		input = append(input,
			map[string]any{"role": "assistant", "content": []map[string]any{{"type": "output_text", "text": r.Output[0].Content[0].Text}}},
			map[string]any{"role": "user", "content": fmt.Sprintf("Now section %d.", turn+2)})
	}
}
