package overhead

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/bench"
)

// Scenario is one column group of the overhead table.
type Scenario struct {
	Name    string
	Path    string // "" is /v1/completions
	Clients int
	Body    []byte
	// Bodies, if set, are the clients' bodies (see [Load]).
	Bodies [][]byte
	Stream bool
	// PerClient, if above 0, is how many requests each client sends;
	// 0 runs for the duration.
	PerClient int
}

// Scenarios are the scenarios of DESIGN.md's overhead benchmark:
// added latency at low concurrency, throughput at high concurrency, long
// prompts, and many concurrent streams. The backend answers one token at
// once; streams ask for 50, which it paces 10ms apart, as a busy server
// does. long-chat is issue 19's agent load: 150 clients at once, each
// sending its own 220 KB chat prompt 4 times as a stream of one token,
// timed to the first token.
func Scenarios(scale float64) []Scenario {
	clients := func(n int) int { return max(1, int(float64(n)*scale)) }
	small := completionBody(1024, false)
	chats := make([][]byte, clients(150))
	for i := range chats {
		chats[i] = chatBody(uint64(i), 220<<10)
	}
	return []Scenario{
		{Name: "latency", Clients: 1, Body: small},
		{Name: "throughput", Clients: clients(64), Body: small},
		{Name: "long-prompt", Clients: clients(8), Body: completionBody(256<<10, false)},
		{Name: "long-chat", Path: "/v1/chat/completions", Clients: len(chats), Bodies: chats, Stream: true, PerClient: 4},
		{Name: "streams", Clients: clients(256), Body: completionBody(1024, true), Stream: true},
	}
}

// chatBody is a streamed /v1/chat/completions request for one token
// whose system and user messages hold n bytes of text between them: a
// 16 KB system prompt every client shares, then a user message of its
// own (client seeds its text).
func chatBody(client uint64, n int) []byte {
	const system = 16 << 10
	sys := (&bench.Request{Parts: []bench.Part{{ID: 76, Tokens: system / 4}}}).AppendText(nil)
	user := (&bench.Request{Parts: []bench.Part{{ID: 1000 + client, Tokens: (n - system) / 4}}}).AppendText(nil)
	b, _ := json.Marshal(map[string]any{"model": bench.Model, "stream": true, "max_tokens": 1,
		"messages": []map[string]string{{"role": "system", "content": string(sys)}, {"role": "user", "content": string(user)}}})
	return b
}

// completionBody is a /v1/completions request with a prompt of n bytes.
func completionBody(n int, stream bool) []byte {
	prompt := (&bench.Request{Parts: []bench.Part{{ID: 77, Tokens: n / 4}}}).AppendText(nil)
	req := map[string]any{"model": bench.Model, "prompt": string(prompt), "max_tokens": 1}
	if stream {
		req["stream"] = true
		req["max_tokens"] = 50
	}
	b, _ := json.Marshal(req)
	return b
}

// pickScenarios returns the scenarios of all that names asks for, in
// their order; no names is every one.
func pickScenarios(all []Scenario, names []string) ([]Scenario, error) {
	if len(names) == 0 {
		return all, nil
	}
	var out []Scenario
	for _, n := range names {
		i := slices.IndexFunc(all, func(sc Scenario) bool { return sc.Name == n })
		if i < 0 {
			known := make([]string, len(all))
			for j, sc := range all {
				known[j] = sc.Name
			}
			return nil, fmt.Errorf("overhead: no scenario %q (scenarios: %s)", n, strings.Join(known, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}
