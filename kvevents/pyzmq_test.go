package kvevents

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestRealZeroMQPublisher subscribes to a publisher written with pyzmq
// (libzmq) and Python's msgpack, which frames, numbers, replays and
// encodes batches as vLLM does, in both the encodings vLLM has used. The
// stored batch goes out before the publisher tells its ports, so the index
// can only have it through libzmq's ROUTER replay. Debian's python3-zmq and
// python3-msgpack provide the libraries; .ci/run installs them and sets
// LLMLBTEST_REQUIRE_PYZMQ, and then the test must not skip.
func TestRealZeroMQPublisher(t *testing.T) {
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		if os.Getenv("LLMLBTEST_REQUIRE_PYZMQ") != "" {
			t.Fatalf("%s cannot import zmq and msgpack (%v), and LLMLBTEST_REQUIRE_PYZMQ is set (apt-get install python3-zmq python3-msgpack)", python, err)
		}
		t.Skipf("%s cannot import zmq and msgpack: apt-get install python3-zmq python3-msgpack", python)
	}
	tokens := make([]uint32, 12)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	blocks := Blocks(nil, tokens, 4, "")
	for _, mode := range []string{"map", "array"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			cmd := exec.CommandContext(ctx, python, "testdata/vllm_publisher.py", mode)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				stdin.Close()
				_ = cmd.Wait()
			}()
			var pubPort, replayPort int
			if _, err := fmt.Fscan(bufio.NewReader(stdout), &pubPort, &replayPort); err != nil {
				t.Fatalf("reading the publisher's ports: %v", err)
			}
			store := NewStore()
			seqs := make(chan int64, 1024)
			sub := &Subscriber{ID: "a", Store: store, Retry: 10 * time.Millisecond,
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort),
				Replay:   fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
				OnBatch:  func(seq int64, _ int) { seqs <- seq }}
			go func() { _ = sub.Run(ctx) }()
			deadline := time.After(30 * time.Second)
			for {
				select {
				case <-seqs:
				case <-deadline:
					t.Fatal("no batch within 30s")
				}
				if store.Match("a", blocks) == 3 {
					return
				}
			}
		})
	}
}
