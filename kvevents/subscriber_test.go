package kvevents

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/sim"
)

// subscribe runs a subscriber of endpoint into s and returns a channel of
// the batch numbers it enters.
func subscribe(t *testing.T, ctx context.Context, s *Store, endpoint, replay string) <-chan int64 {
	t.Helper()
	seqs := make(chan int64, 1024)
	sub := &Subscriber{ID: "a", Endpoint: endpoint, Replay: replay, Store: s, Retry: 10 * time.Millisecond,
		OnBatch: func(seq int64, _ int) { seqs <- seq }}
	go func() { _ = sub.Run(ctx) }()
	return seqs
}

// caughtUp publishes a harmless removal every few milliseconds until the
// subscriber has entered one of them: then it has entered every batch
// published before the call, since a ZeroMQ connection keeps order. (A
// PUB socket drops what it sends before a subscription reaches it.)
func caughtUp(t *testing.T, p *sim.KVPublisher, seqs <-chan int64) {
	t.Helper()
	want := int64(p.Published())
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case seq := <-seqs:
			if seq >= want {
				return
			}
		case <-tick.C:
			if err := p.Publish([]sim.KVEvent{{Hash: 1}}); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("no batch %d within 30s", want)
		}
	}
}

// TestSubscriberFollowsAnEmulatedServer runs an emulated vLLM server that
// publishes its KV events, sends it a prompt, and checks that the index
// holds the prompt's blocks as the server's /tokenize names them.
func TestSubscriberFollowsAnEmulatedServer(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg, err := sim.Preset("h100-8b")
	if err != nil {
		t.Fatal(err)
	}
	live := sim.NewLive(cfg, 1000)
	pub, err := sim.NewKVPublisher(ctx, "127.0.0.1:0", "127.0.0.1:0", cfg.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	live.PublishKV(pub)
	srv, err := sim.NewServer(sim.ServerConfig{Model: "m"}, live)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	store := NewStore()
	seqs := subscribe(t, ctx, store, pub.Endpoint(), pub.ReplayEndpoint())
	caughtUp(t, pub, seqs)

	prompt := strings.Repeat("the same long system prompt, ", 40) + "and a question"
	post := func(path string, body any) []byte {
		b, _ := json.Marshal(body)
		resp, err := http.Post(hs.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, out.Bytes())
		}
		return out.Bytes()
	}
	var tok struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(post("/tokenize", map[string]any{"model": "m", "prompt": prompt}), &tok); err != nil {
		t.Fatal(err)
	}
	if tok.Count != len(prompt)/sim.BytesPerToken || len(tok.Tokens) != tok.Count {
		t.Fatalf("tokenize: count %d, %d tokens, prompt %d bytes", tok.Count, len(tok.Tokens), len(prompt))
	}
	post("/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
	blocks := Blocks(nil, tok.Tokens, cfg.BlockSize, "")
	if len(blocks) == 0 {
		t.Fatal("prompt shorter than a block")
	}
	// The server published the blocks before it answered.
	caughtUp(t, pub, seqs)
	if got := store.Match("a", blocks); got != len(blocks) {
		t.Fatalf("index holds %d of the prompt's %d blocks", got, len(blocks))
	}
}

// TestSubscriberReplaysMissedBatches: batches published before the
// subscription are read from the replay socket. Whether a subscriber
// without one misses them depends on when the publisher's queue sends
// them, so that case is TestStreamGapsAndRestarts's, which drives the
// numbering directly.
func TestSubscriberReplaysMissedBatches(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const bs = 4
	pub, err := sim.NewKVPublisher(ctx, "127.0.0.1:0", "127.0.0.1:0", bs)
	if err != nil {
		t.Fatal(err)
	}
	evs, tokens := chain(5, 3, bs, "")
	for _, e := range evs {
		if err := pub.Publish([]sim.KVEvent{e}); err != nil {
			t.Fatal(err)
		}
	}
	store := NewStore()
	seqs := subscribe(t, ctx, store, pub.Endpoint(), pub.ReplayEndpoint())
	caughtUp(t, pub, seqs)
	blocks := Blocks(nil, tokens, bs, "")
	if got := store.Match("a", blocks); got != 3 {
		t.Fatalf("after replay the index holds %d of 3 blocks", got)
	}
}

// TestStreamGapsAndRestarts drives the numbering checks directly.
func TestStreamGapsAndRestarts(t *testing.T) {
	const bs = 2
	store := NewStore()
	var resets []string
	st := stream{s: &Subscriber{ID: "a", Store: store, OnReset: func(r string) { resets = append(resets, r) }}, log: discard(), last: -1}
	evs, tokens := chain(6, 2, bs, "")
	blocks := Blocks(nil, tokens, bs, "")
	msg := func(seq uint64, evs []sim.KVEvent) [][]byte {
		var n [8]byte
		for i := range 8 {
			n[7-i] = byte(seq >> (8 * i))
		}
		return [][]byte{nil, n[:], sim.EncodeKVBatch(nil, 0, evs, bs)}
	}
	st.receive(t.Context(), msg(10, evs))
	if store.Match("a", blocks) != 2 {
		t.Fatal("first batch not entered")
	}
	// A gap without a replay socket: a removal may have been lost.
	st.receive(t.Context(), msg(12, nil))
	if store.Match("a", blocks) != 0 {
		t.Fatal("a gap kept the table")
	}
	st.receive(t.Context(), msg(13, evs))
	// A lower number: the server restarted, with an empty cache.
	st.receive(t.Context(), msg(0, nil))
	if store.Match("a", blocks) != 0 {
		t.Fatal("a restart kept the table")
	}
	st.receive(t.Context(), msg(1, evs))
	// A message that cannot be read: so is the table.
	st.receive(t.Context(), [][]byte{nil, {0, 0, 0, 0, 0, 0, 0, 2}, {0xc1}})
	if store.Match("a", blocks) != 0 || st.last != 2 {
		t.Fatal("an unreadable batch kept the table")
	}
	st.receive(t.Context(), [][]byte{{1}})
	if st.last != 2 {
		t.Fatal("a malformed message moved the numbering")
	}
	if want := []string{"gap", "restart", "unreadable", "unreadable"}; !slices.Equal(resets, want) {
		t.Errorf("resets %v, want %v", resets, want)
	}
}
