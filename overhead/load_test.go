package overhead

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestLoadCountsWhatItReads: whole streams are timed and counted; a 503,
// and a stream cut before [DONE], are errors, not requests.
func TestLoadCountsWhatItReads(t *testing.T) {
	stream := func(done bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
				w.(http.Flusher).Flush()
			}
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n")
			if done {
				fmt.Fprint(w, "data: [DONE]\n\n")
			}
		}
	}
	good := httptest.NewServer(stream(true))
	defer good.Close()
	cut := httptest.NewServer(stream(false))
	defer cut.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer busy.Close()

	run := func(url string) LoadResult {
		return Load{URL: url, Body: []byte(`{}`), Stream: true, Clients: 2, Duration: 50 * time.Millisecond}.Run(context.Background())
	}
	r := run(good.URL)
	if r.Requests == 0 || r.Errors != 0 || r.Events != 3*int64(r.Requests) || len(r.TTFT) != r.Requests || len(r.Gaps) != 2*r.Requests {
		t.Errorf("good server: %d requests, %d errors (%s), %d events, %d ttfts, %d gaps", r.Requests, r.Errors, r.FirstErr, r.Events, len(r.TTFT), len(r.Gaps))
	}
	if r := run(cut.URL); r.Requests != 0 || r.Errors == 0 || !strings.Contains(r.FirstErr, "[DONE]") {
		t.Errorf("stream without [DONE]: %d requests, %d errors (%s)", r.Requests, r.Errors, r.FirstErr)
	}
	if r := run(busy.URL); r.Requests != 0 || r.Errors == 0 || !strings.Contains(r.FirstErr, "503") {
		t.Errorf("503: %d requests, %d errors (%s)", r.Requests, r.Errors, r.FirstErr)
	}
}
