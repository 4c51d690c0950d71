package proxy

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
)

// breqOf parses body as a request of kind k and returns what s asks its
// balancer to pick for.
func breqOf(t *testing.T, s *Server, k Kind, body []byte) *balancer.Request {
	t.Helper()
	req, err := ParseRequest(k, body)
	if err != nil {
		t.Fatal(err)
	}
	breq, _, err := s.balancerRequest(httptest.NewRequest("POST", "/", nil), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return breq
}

// TestLongPromptPicksInParts: a chat whose texts are long reaches the
// default policy's pick in parts (hashed where it lies in the body, never
// copied into a canonical buffer) and is matched exactly as the same
// prompt in one piece: after the first request taught the index which
// backend holds the shared system prompt, /debug/route's explanation of
// the second is the same either way, and it is a prefix hit. A policy
// that reads the prompt's bytes (consistent-hash) gets them whole.
func TestLongPromptPicksInParts(t *testing.T) {
	bal := newBal(t, balancer.DefaultConfig().Policy)
	for _, id := range []string{"a", "b", "c"} {
		u, _ := url.Parse("http://" + id + ".invalid")
		bal.Update(balancer.Spec{ID: id, URL: u, Engine: "vllm", Models: []string{testModel}, State: balancer.StateReady,
			Metrics: balancer.Metrics{Queued: balancer.Known(0), Running: balancer.Known(0), KVUsage: balancer.Known(0.1), At: time.Now()}})
	}
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: prometheus.NewRegistry()})
	system := strings.Repeat("You are the careful assistant of the billing team. ", 200) // 10 KB
	chat := func(q string) []byte {
		b, _ := json.Marshal(map[string]any{"model": testModel, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": q + strings.Repeat(" and more", 600)}}})
		return b
	}
	first := breqOf(t, s, KindChat, chat("What is due?"))
	if first.Parts == nil || first.Prompt != nil {
		t.Fatalf("a 15 KB chat reached the pick with Parts %v and %d prompt bytes, want parts only", first.Parts != nil, len(first.Prompt))
	}
	first.Guard = bal.NewGuard()
	dec, err := bal.Pick(first, nil)
	if err != nil {
		t.Fatal(err)
	}
	first.Guard.Release()

	second := breqOf(t, s, KindChat, chat("When is it due?"))
	whole := *second
	whole.Parts, whole.Prompt = nil, second.Parts.(interface{ AppendTo([]byte) []byte }).AppendTo(nil)
	inParts, inOne := bal.Explain(second), bal.Explain(&whole)
	if !reflect.DeepEqual(inParts, inOne) {
		t.Errorf("explained in parts:\n%+v\nin one piece:\n%+v", inParts, inOne)
	}
	if len(inParts.Chosen) == 0 || inParts.Chosen[0]+" "+string(inParts.Reason) != dec.Candidates[0].ID+" prefix-hit" {
		t.Errorf("second request: %v %s, want %s prefix-hit", inParts.Chosen, inParts.Reason, dec.Candidates[0].ID)
	}

	ring := newServer(t, Options{Config: DefaultConfig(), Balancer: newBal(t, "consistent-hash"), Registerer: prometheus.NewRegistry()})
	req, _ := ParseRequest(KindCompletion, []byte(fmt.Sprintf(`{"model":%q,"prompt":%q}`, testModel, system)))
	breq, _, _ := ring.balancerRequest(httptest.NewRequest("POST", "/v1/completions", nil), req, nil)
	if breq.Parts != nil || string(breq.Prompt) != system {
		t.Errorf("consistent-hash got Parts %v and %d prompt bytes, want the %d bytes whole", breq.Parts != nil, len(breq.Prompt), len(system))
	}
}

// TestChatTurnsReachThePick: a chat's pick is told where its first user
// message lies and whether the chat goes on past it, the same on every
// turn of a conversation (the default policy places a conversation by
// those bytes); a completion is told nothing.
func TestChatTurnsReachThePick(t *testing.T) {
	s := newServer(t, Options{Config: DefaultConfig(), Balancer: newBal(t, balancer.DefaultConfig().Policy), Registerer: prometheus.NewRegistry()})
	system := strings.Repeat("You are the careful assistant of the billing team. ", 200)
	msgs := []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "What is due?" + strings.Repeat(" and more", 600)}}
	body := func(v any) []byte { b, _ := json.Marshal(v); return b }
	first := breqOf(t, s, KindChat, body(map[string]any{"model": testModel, "messages": msgs}))
	later := breqOf(t, s, KindChat, body(map[string]any{"model": testModel, "messages": append(msgs, map[string]string{"role": "assistant", "content": "Nothing."}, map[string]string{"role": "user", "content": "Sure?"})}))
	if first.FirstUser <= len(system) || first.FirstTurn <= first.FirstUser || first.LaterTurn() {
		t.Errorf("first turn: FirstUser %d, FirstTurn %d, LaterTurn %v; want the user message after the %d-byte system prompt, no later turn", first.FirstUser, first.FirstTurn, first.LaterTurn(), len(system))
	}
	if later.FirstUser != first.FirstUser || later.FirstTurn != first.FirstTurn || !later.LaterTurn() {
		t.Errorf("later turn: FirstUser %d, FirstTurn %d, LaterTurn %v; want %d, %d, true", later.FirstUser, later.FirstTurn, later.LaterTurn(), first.FirstUser, first.FirstTurn)
	}
	c := breqOf(t, s, KindCompletion, body(map[string]any{"model": testModel, "prompt": system}))
	if c.FirstUser != 0 || c.FirstTurn != 0 || c.LaterTurn() {
		t.Errorf("completion: FirstUser %d, FirstTurn %d, LaterTurn %v; want none", c.FirstUser, c.FirstTurn, c.LaterTurn())
	}
}
