package sim

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// advance moves the bubble's fake clock on by d and returns once every
// goroutine in the bubble has done what that time let it do. Call it only
// from the bubble's root goroutine. It is the sim tests' one time.Sleep:
// inside a synctest bubble, virtual time.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// TestLiveRealTime: the real-time driver gives the engine model's times,
// divided by the speed, and a second request with the same long prompt
// prefix is served from the cache sooner.
func TestLiveRealTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, _ := Preset("h100-8b")
		l := NewLive(cfg, 2)
		sys := strings.Repeat("the same long system prompt ", 1200) // ~8,400 tokens
		run := func(q string) (time.Duration, int) {
			start := time.Now()
			var first time.Duration
			cached, err := l.Run(context.Background(), Job{Prompt: []byte(sys + q), PromptTokens: len(sys+q) / BytesPerToken, MaxTokens: 3, Seed: 1},
				func() error {
					if first == 0 {
						first = time.Since(start)
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			return first, cached
		}
		cold, c1 := run("first question?")
		warm, c2 := run("second question!")
		if c1 != 0 || c2 < 8000 {
			t.Errorf("cached tokens %d then %d, want 0 then most of the prompt", c1, c2)
		}
		// 8,400 tokens in two chunked-prefill steps at half the modelled time
		if cold < 100*time.Millisecond || cold > 200*time.Millisecond {
			t.Errorf("cold first token after %v at speed 2", cold)
		}
		if warm > cold/4 {
			t.Errorf("warm first token after %v, cold %v", warm, cold)
		}
		if st := l.Stats(); st.Running != 0 || st.KVUsage != 0 || st.PrefixHits < 8000 {
			t.Errorf("stats after: %+v", st)
		}
	})
}

// TestLiveCancel: a request whose context ends leaves the engine and frees
// its blocks, and the step goroutine stops.
func TestLiveCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, _ := Preset("h100-8b")
		l := NewLive(cfg, 1)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			_, err := l.Run(ctx, Job{Prompt: []byte(strings.Repeat("x", 4000)), PromptTokens: 1000, MaxTokens: 10000, Seed: 1}, func() error { return nil })
			done <- err
		}()
		advance(500 * time.Millisecond)
		if st := l.Stats(); st.Running != 1 || st.KVUsage == 0 {
			t.Fatalf("running %d kv %.3f mid-request", st.Running, st.KVUsage)
		}
		cancel()
		if err := <-done; err == nil {
			t.Fatal("cancelled run returned no error")
		}
		if st := l.Stats(); st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 {
			t.Errorf("after cancel: %+v", st)
		}
		advance(time.Second) // the step in progress ends
		l.mu.Lock()
		looping := l.looping
		l.mu.Unlock()
		if looping {
			t.Error("the step goroutine still runs with no request left")
		}
	})
}
