package demo

import (
	"bytes"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoViewShowsStatusPresetsAndLegend is issue 18's eighth problem: the
// status page address was printed once and wiped by the live view, nothing
// said which server ran the slower A100 model, the columns had no legend,
// and LoRA warnings opened every run. Every frame now starts with the
// status page address, names each server's preset and explains each
// column, and a run logs no warning at all.
func TestDemoViewShowsStatusPresetsAndLegend(t *testing.T) {
	var out, logs bytes.Buffer
	err := Run(t.Context(), Options{Backends: 4, Duration: 3 * time.Second, Speed: 8, Concurrency: 4, Status: "127.0.0.1:0"}, &out, &logs)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, logs.String())
	}
	frames := strings.Split(out.String(), "\nllmlb demo: ")[1:]
	if len(frames) < 2 {
		t.Fatalf("%d frames, want at least 2:\n%s", len(frames), out.String())
	}
	status := regexp.MustCompile(`^\S+ of 3s; status page (http://127\.0\.0\.1:\d+/); proxy http://`)
	for i, f := range frames {
		if strings.HasPrefix(f, "done;") {
			continue
		}
		if !status.MatchString(f) {
			t.Errorf("frame %d does not start with the status page address:\n%s", i, f)
		}
		for _, want := range []string{"preset", " h100-8b ", " a100-8b ", "preset    the engine model", "load      one # per request"} {
			if !strings.Contains(f, want) {
				t.Errorf("frame %d lacks %q:\n%s", i, want, f)
			}
		}
		if got := len(regexp.MustCompile(`(?m)^b\d 127\.0\.0\.1:\d+\s+h100-8b\s`).FindAllString(f, -1)); got != 3 {
			t.Errorf("frame %d names h100-8b %d times beside a backend's name and address, want 3 (the fourth server is the a100-8b)", i, got)
		}
	}
	if logs.Len() > 0 {
		t.Errorf("the demo logged at warn level or above (LoRA warnings, say):\n%s", logs.String())
	}
	done := regexp.MustCompile(`done; (\d+) requests served over \d+ backends, 0 failed; (\d+) streams a server ended early continued on another`).FindStringSubmatch(out.String())
	if done == nil {
		t.Fatalf("no done line with 0 failed and the streams continued:\n%s", out.String())
	}
}

// TestDemoStatusPortInUse: the fixed status address taken is an error
// that names the flag to change it.
func TestDemoStatusPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out, logs bytes.Buffer
	err = Run(t.Context(), Options{Backends: 4, Duration: time.Second, Speed: 1, Concurrency: 24, Status: ln.Addr().String()}, &out, &logs)
	if err == nil || !strings.Contains(err.Error(), "--status") {
		t.Errorf("demo on a taken status address: %v, want an error naming --status", err)
	}
}
