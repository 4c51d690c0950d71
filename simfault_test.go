package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSimFaultFlag starts `llmlb sim --count 2 --fault 429 --fault-on 1`:
// the second server answers 429, the first does not, and PUT /sim/faults
// clears the fault at runtime.
func TestSimFaultFlag(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{ch: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"sim", "--listen", "127.0.0.1:0", "--count", "2", "--speed", "100", "--fault", "429", "--fault-on", "1"}, nil, out, out)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addrRE := regexp.MustCompile(`at (http://\S+)`)
	var urls []string
	deadline := time.After(10 * time.Second)
	for len(urls) < 2 {
		select {
		case line := <-out.ch:
			if m := addrRE.FindStringSubmatch(line); m != nil {
				urls = append(urls, m[1])
			}
		case <-deadline:
			t.Fatalf("sim printed %d addresses, want 2", len(urls))
		}
	}
	status := func(u string) int {
		t.Helper()
		resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(`{"model":"llama-3.1-8b","prompt":"hi","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(urls[0]); got != 200 {
		t.Errorf("server 0 answered %d, want 200 (--fault-on 1)", got)
	}
	if got := status(urls[1]); got != 429 {
		t.Errorf("server 1 answered %d, want 429", got)
	}
	req, _ := http.NewRequest(http.MethodDelete, urls[1]+"/sim/faults", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := status(urls[1]); got != 200 {
		t.Errorf("server 1 answered %d after DELETE /sim/faults, want 200", got)
	}
}

func TestSimFaultFlagRejectsUnknown(t *testing.T) {
	err, _, _ := runCmd(t, nil, "sim", "--listen", "127.0.0.1:0", "--fault", "explode")
	if err == nil || !strings.Contains(err.Error(), `unknown fault "explode"`) {
		t.Errorf("sim --fault explode: %v, want an unknown fault error", err)
	}
}
