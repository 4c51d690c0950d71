package balancer

import (
	"fmt"
	"strings"
	"testing"
)

// Conversations whose first user messages are shorter than a block still
// have keys of their own: the last whole block of a first turn may lie
// inside the system prompt, so the key reads the bytes after it too.
func TestShortFirstMessagesKeepConversationsApart(t *testing.T) {
	b := replicated(t)
	b.Update(busy("a", 0, 0, 0.1), busy("b", 0, 0, 0.1), busy("c", 0, 0, 0.1), busy("d", 0, 0, 0.1))
	sys := strings.Repeat("You are a helpful assistant. ", 200)
	n := map[string]int{}
	for c := range 120 {
		p := fmt.Appendf([]byte(sys), "user: hi %d", c) // 11-13 bytes
		first := len(p)
		p = append(p, " assistant: hello user: what is due?"...)
		req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100, FirstUser: len(sys), FirstTurn: first}
		d, err := b.Pick(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		n[d.Candidates[0].ID]++
	}
	t.Logf("120 conversations' later turns: %v", n)
	for id, k := range n {
		if k > 45 {
			t.Errorf("%s took %d of 120 conversations with short first messages, over 1.5x its share (%v)", id, k, n)
		}
	}
}
