package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRejectionsListedAndCountedByModel is issue 18's fifth problem:
// llmlb's own answers (400, 404, 415) were missing from the status page's
// recent requests and counted with model="". Each is now listed with the
// model the client asked for, and counted under it when a backend offers
// that name; a name no backend ever offered is counted as "unknown",
// since client-chosen names would make the label's values unbounded.
func TestRejectionsListedAndCountedByModel(t *testing.T) {
	var hits atomic.Int64
	backend := okBackend(t, &hits)
	bal := newTestBalancer(t, backend.URL)
	reg := prometheus.NewRegistry()
	px := newServer(t, Options{Config: DefaultConfig(), Balancer: bal, Registerer: reg})
	srv := httptest.NewServer(px.Handler())
	defer srv.Close()
	for _, c := range []struct {
		contentType, body string
		want              int
	}{
		{"application/json", `{"model":"` + testModel + `","prompt":"hi","max_tokens":-1}`, 400},
		{"application/json", `{"model":"made-up-model","prompt":"hi","max_tokens":-1}`, 400},
		{"application/json", `{"model":"no-such-model","prompt":"hi"}`, 404},
		{"text/plain", `{"model":"` + testModel + `","prompt":"hi"}`, 415},
		{"application/json", `{"model":"` + testModel + `","prompt":"hi"}`, 200},
	} {
		resp, err := http.Post(srv.URL+"/v1/completions", c.contentType, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("POST %s = %d, want %d", c.body, resp.StatusCode, c.want)
		}
	}
	// A request is listed as its handler returns, which can be after the
	// client has read the whole answer.
	recent, reasons, _ := px.picks.view()
	for deadline := time.Now().Add(10 * time.Second); len(recent) < 5 && time.Now().Before(deadline); recent, reasons, _ = px.picks.view() {
		<-time.After(10 * time.Millisecond)
	}
	for _, c := range []struct {
		model, status string
		want          float64
	}{
		{testModel, "400", 1},
		{unknownModel, "400", 1},
		{unknownModel, "404", 1},
		{unknownModel, "415", 1}, // refused before its model was read
	} {
		if got := testutil.ToFloat64(px.metrics.requests.WithLabelValues(c.model, c.model, "none", c.status)); got != c.want {
			t.Errorf("llmlb_requests_total{model=%q,status=%s} = %v, want %v", c.model, c.status, got, c.want)
		}
	}
	for _, status := range []string{"400", "415"} {
		if got := testutil.ToFloat64(px.metrics.requests.WithLabelValues("", "", "none", status)); got != 0 {
			t.Errorf(`llmlb_requests_total{model="",status=%q} = %v, want 0`, status, got)
		}
	}
	var listed []string
	for _, e := range recent {
		listed = append(listed, e.Model+" "+http.StatusText(e.Status))
		if e.Duration <= 0 {
			t.Errorf("entry %+v has no duration", e)
		}
	}
	// The 415 is answered before the body is read: no model to list.
	want := []string{testModel + " OK", " Unsupported Media Type", "no-such-model Not Found", "made-up-model Bad Request", testModel + " Bad Request"}
	if strings.Join(listed, "|") != strings.Join(want, "|") {
		t.Errorf("recent requests = %q, want %q", listed, want)
	}
	var picks int64
	for _, r := range reasons {
		picks += r.N
	}
	if picks != 1 {
		t.Errorf("picks by reason count %d, want 1: rejections are not picks", picks)
	}
}
