package balancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSaturatedBackendsAreSkipped(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(ready("busy", 20, 4, 0.5), ready("kvfull", 0, 4, 0.97), ready("ok", 3, 4, 0.5))
	for range 20 {
		if d := mustPick(t, b, &Request{Model: "m"}, nil); d.Candidates[0].ID != "ok" || len(d.Candidates) != 1 {
			t.Fatalf("picked %v, want only ok", ids(d.Candidates))
		}
	}
	// Queue counted with what we sent since the scrape: 13 more make ok
	// saturated too, and with the admission queue on, Pick says so.
	for range 13 {
		g := b.NewGuard()
		g.Attach(backend(t, b, "ok"), Work{}, time.Now())
		defer g.Release()
	}
	if _, err := b.Pick(&Request{Model: "m"}, nil); !errors.Is(err, ErrSaturated) {
		t.Errorf("all saturated: err %v, want ErrSaturated", err)
	}
	off := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Admission.MaxQueue = 0 })
	off.Update(ready("busy", 20, 4, 0.5))
	if d, err := off.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason != "saturated" {
		t.Errorf("queue off, all saturated: %v %v, want busy saturated", d.Reason, err)
	}
	// Stale metrics: passed over while a fresh backend exists, used when
	// none does.
	st := newBal(t, "ttft")
	stale := ready("stale", 0, 0, 0)
	stale.Stale = true
	st.Update(stale, ready("fresh", 10, 0, 0))
	if d, _ := st.Pick(&Request{Model: "m"}, nil); d.Candidates[0].ID != "fresh" || len(d.Candidates) != 1 {
		t.Errorf("stale vs fresh: %v", ids(d.Candidates))
	}
	st.Remove("fresh")
	if d, err := st.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason != "stale-metrics" {
		t.Errorf("only stale: %v %v", d.Reason, err)
	}
}

// A backend without a scraped queue is not saturated by our own pending
// requests alone (they may all be prefilling on a server with room).
func TestUnscrapedQueueDoesNotSaturate(t *testing.T) {
	b := newBal(t, "ttft")
	b.Update(spec("nometrics", StateReady, "m"))
	for range 40 {
		g := b.NewGuard()
		g.Attach(backend(t, b, "nometrics"), Work{}, time.Now())
		defer g.Release()
	}
	if d, err := b.Pick(&Request{Model: "m"}, nil); err != nil || d.Reason == "saturated" {
		t.Errorf("40 pending on a backend without metrics: %q %v, want it picked unsaturated", d.Reason, err)
	}
}

// A saturated holder stays a candidate while its queue is within
// HolderQueue times the shortest, however full the fleet; past that it is
// saturated like the others, and with none left the request waits for
// room: kept whatever its queue, the holder was often the only candidate
// and took every request on its prompts (4 servers, burst at x4: 299 of
// one 300-request burst went to the A100 holding its prefix, its queue
// 313 long, the others' near 16).
func TestSaturatedHolderIsBoundedByTheOthersQueues(t *testing.T) {
	system := strings.Repeat("g", 4*4000)
	p := fmt.Appendf([]byte(system), " user question %s", strings.Repeat("u", 800))
	req := &Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4, MaxTokens: 100}
	candidates := func(b *Balancer, holderQ, zQ float64) []string {
		t.Helper()
		b.Update(busy("holder", holderQ, 120, 0.6), busy("x", 20, 120, 0.6), busy("y", 18, 120, 0.6), busy("z", zQ, 120, 0.6))
		b.pol.index.Insert(backend(t, b, "holder").slot, b.pol.index.AppendHashes(nil, 0, []byte(system)))
		var ids []string
		for _, be := range b.Explain(req).Backends {
			if be.Excluded == "" {
				ids = append(ids, be.ID)
			}
		}
		return ids
	}
	b := newBal(t, "ttft")
	// The fleet saturated as a whole: the holder, 40 waiting, keeps its prompt.
	if got := candidates(b, 40, 17); !slices.Equal(got, []string{"holder"}) {
		t.Errorf("holder 40 waiting, every other saturated: candidates %v, want holder", got)
	}
	// 80 waiting, past 4 x 17: saturated like the others.
	candidates(b, 80, 17)
	if d, err := b.Pick(req, nil); !errors.Is(err, ErrSaturated) {
		t.Errorf("holder 80 waiting, every other saturated: picked %v (%s, %v), want ErrSaturated", ids(d.Candidates), d.Reason, err)
	}
	// 80 waiting, z with room: z alone.
	if got := candidates(b, 80, 3); !slices.Equal(got, []string{"z"}) {
		t.Errorf("holder 80 waiting, z 3: candidates %v, want z", got)
	}
	// No bound: the holder whatever its queue.
	nb := newBal(t, "ttft", func(c *Config, _ *Deps) { c.Saturation.HolderQueue = 0 })
	if got := candidates(nb, 300, 17); !slices.Equal(got, []string{"holder"}) {
		t.Errorf("holder_queue 0, holder 300 waiting: candidates %v, want holder", got)
	}
}
