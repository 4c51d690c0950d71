package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/pipenet"
	"github.com/llmlb/llmlb/prefix"
	"github.com/llmlb/llmlb/scrape"
	"github.com/llmlb/llmlb/sim"
)

// rotationCase is one of issue 17's faults and the rule that takes the
// faulty backend out of rotation, as a bound in virtual time.
type rotationCase struct {
	spec string // the fault as sim --fault reads it, without for=; "refuse" kills the server's listener
	// mayFail: requests sent before the server left rotation may fail;
	// otherwise none may.
	mayFail bool
	// wantOutWithin is how soon after the fault began the backend must be
	// out of rotation, by the rule that takes it out.
	wantOutWithin func(rotationFleet) time.Duration
	tweak         func(*rotationFleet)
}

// rotationFleet is the configuration a rotation case runs with: the e2e
// fault tests' settings, changed by the case's tweak.
type rotationFleet struct {
	proxy   Config
	bal     balancer.Config
	scrape  scrape.Config
	clients int
}

// ejected is the bound for a failure the proxy sees detect after a request
// reaches the faulty backend: EjectAfter of them in a row eject it. Six
// clients streaming 80 ms answers over three backends send it EjectAfter
// requests within half a second; the half second is that, not slack for
// a slow machine (the clock is synctest's).
func ejected(detect func(rotationFleet) time.Duration) func(rotationFleet) time.Duration {
	return func(f rotationFleet) time.Duration { return detect(f) + 500*time.Millisecond }
}

func atOnce(rotationFleet) time.Duration { return 0 }

// nextScrape is the longest time to the backend's next scrape: an interval
// jittered 10% longer.
func nextScrape(f rotationFleet) time.Duration { return f.scrape.Interval + f.scrape.Interval/10 }

func rotationCases() []rotationCase {
	return []rotationCase{
		// Connections refused and open ones cut: connect failures eject
		// it (and its health check fails too).
		{spec: "refuse", mayFail: true, wantOutWithin: ejected(atOnce)},
		{spec: "close", wantOutWithin: ejected(atOnce)},
		{spec: "die-mid-stream:events=2", mayFail: true, wantOutWithin: ejected(atOnce)},
		// No headers: each attempt fails at the first-byte timeout, and
		// the request goes to another backend.
		{spec: "hang", wantOutWithin: ejected(func(f rotationFleet) time.Duration { return f.proxy.StreamFirstByteTimeout })},
		// Two events, then silence: each stream is cut at the idle limit.
		{spec: "stall:events=2", mayFail: true, wantOutWithin: ejected(func(f rotationFleet) time.Duration { return f.proxy.StreamIdleTimeout })},
		// First tokens 300 ms apart, 30 times the fleet's: a TTFT outlier
		// once OutlierMinSamples first tokens have shown it. A drip is
		// slow, not silent: the idle limit is above its gap.
		{spec: "drip:gap=300ms", wantOutWithin: func(f rotationFleet) time.Duration {
			return time.Duration(f.bal.Passive.OutlierMinSamples) * 300 * time.Millisecond
		}, tweak: func(f *rotationFleet) { f.proxy.StreamIdleTimeout = 3 * time.Second }},
		{spec: "5xx:status=503", wantOutWithin: ejected(atOnce)},
		{spec: "5xx:status=500", mayFail: true, wantOutWithin: ejected(atOnce)},
		{spec: "429", wantOutWithin: ejected(atOnce)},
		// A page that cannot be read is stale at the next scrape.
		{spec: "metrics-garbage", wantOutWithin: nextScrape},
		{spec: "metrics-huge:bytes=" + strconv.Itoa(33<<20), wantOutWithin: nextScrape,
			// Scraped every second, not 50 ms: each page is 33 MB
			// through the race detector. stale_after stays above the
			// interval, so that only the page's size makes it stale.
			tweak: func(f *rotationFleet) { f.scrape.Interval, f.scrape.StaleAfter = time.Second, 3*time.Second }},
		// A page that never comes: the last reading ages past
		// stale_after, seen when the next scrape times out.
		{spec: "metrics-hang", wantOutWithin: func(f rotationFleet) time.Duration {
			return f.scrape.StaleAfter + nextScrape(f) + f.scrape.ScrapeTimeout
		}},
		// /health fails from the start: down at the UnhealthyAfter-th
		// failed probe.
		{spec: "health-flap:gap=500ms", wantOutWithin: func(f rotationFleet) time.Duration {
			return time.Duration(f.scrape.UnhealthyAfter) * f.scrape.HealthInterval
		}},
	}
}

// TestFaultyBackendLeavesRotation is issue 17's fault drill in virtual
// time: three emulated vLLM servers (sim's own fault injection) behind the
// real scrape loop, balancer and proxy on a pipenet.Network, and six
// streaming clients. One server shows a fault for two seconds. It must
// leave rotation within the bound of the rule that takes it out
// (EjectAfter failures, the next scrape, stale_after, unhealthy_after
// probes, the outlier rule), return after the fault within the
// readmission bound, and then serve again; no client request fails once
// it is out (those sent before may, for faults that cut a stream or answer
// 500), and every ledger ends at 0 in flight.
func TestFaultyBackendLeavesRotation(t *testing.T) {
	for _, rc := range rotationCases() {
		t.Run(rc.spec, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { runRotation(t, rc) })
		})
	}
}

// killableListener tracks the connections it accepted, so that the
// server behind it can die as a process does: its listener closed
// (dials are refused) and every open connection cut.
type killableListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *killableListener) kill() {
	l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

type rotationRequest struct {
	start time.Time
	err   string // "" when the stream ended with [DONE]
}

func runRotation(t *testing.T, rc rotationCase) {
	const faultFor = 2 * time.Second
	f := rotationFleet{proxy: DefaultConfig(), bal: balancer.DefaultConfig(), scrape: scrape.DefaultConfig(), clients: 6}
	f.bal.Policy = "round-robin" // the faulty server gets its share until it is out
	f.bal.Passive.EjectBackoff = 250 * time.Millisecond
	f.bal.Passive.EjectBackoffMax = time.Second
	f.bal.Passive.OutlierMinSamples = 5
	f.bal.Passive.OutlierMinExcess = 200 * time.Millisecond
	f.scrape.HealthInterval = 100 * time.Millisecond
	f.scrape.Interval = 50 * time.Millisecond
	f.scrape.ScrapeTimeout = 200 * time.Millisecond
	f.scrape.StaleAfter = time.Second
	f.scrape.ReadmitTimeout = time.Second
	f.proxy.StreamFirstByteTimeout = time.Second
	f.proxy.StreamIdleTimeout = time.Second
	if rc.tweak != nil {
		rc.tweak(&f)
	}
	faults, err := sim.ParseFaults(rc.spec)
	if err != nil {
		t.Fatal(err)
	}
	faults[0].For = faultFor

	// Three emulated vLLMs on the pipe network; the last is the faulty
	// one. A stream of 8 tokens takes 80 ms.
	pn := &pipenet.Network{}
	var (
		servers  []*http.Server
		backends []scrape.BackendConfig
		faulty   *sim.Server
		badLn    *killableListener
	)
	for i := range 3 {
		s, err := sim.NewServer(sim.ServerConfig{Model: testModel}, sim.NewSteady(sim.SteadyConfig{DecodeTokensPerSecond: 100}))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("gpu-%d:80", i)
		ln := &killableListener{Listener: pn.Listen(name)}
		hs := &http.Server{Handler: s.Handler()}
		go hs.Serve(ln)
		servers = append(servers, hs)
		backends = append(backends, scrape.BackendConfig{URL: "http://" + name})
		if i == 2 {
			faulty, badLn = s, ln
		}
	}
	bad := backends[2].URL

	bal, err := balancer.New(f.bal, balancer.Deps{Index: prefix.NewIndex(prefix.DefaultConfig())}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	scrapeClient := &http.Client{Transport: &http.Transport{DialContext: pn.DialContext}}
	mgr, err := scrape.NewManager(scrape.Setup{Config: f.scrape, Backends: backends, DefaultEngine: "vllm", Balancer: bal, Client: scrapeClient})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stopScrape := context.WithCancel(t.Context())
	scrapeDone := make(chan struct{})
	go func() { defer close(scrapeDone); _ = mgr.Run(ctx) }()
	px := newServer(t, Options{Config: f.proxy, Balancer: bal, Registerer: prometheus.NewRegistry()})
	px.base.DialContext = dialBodyConn(pn.DialContext)
	front := px.HTTPServer(nil)
	go front.Serve(pn.Listen("llmlb:80"))
	client := &http.Client{Transport: &http.Transport{DialContext: pn.DialContext, MaxIdleConnsPerHost: f.clients}}
	defer func() {
		client.CloseIdleConnections()
		front.Close()
		stopScrape()
		<-scrapeDone
		scrapeClient.CloseIdleConnections()
		px.base.CloseIdleConnections()
		for _, hs := range servers {
			hs.Close()
		}
	}()

	badBackend := func() *balancer.Backend {
		for _, be := range bal.Snapshot().Backends {
			if be.ID == bad {
				return be
			}
		}
		t.Fatalf("no backend %s", bad)
		return nil
	}
	inRotation := func() bool {
		be := badBackend()
		return be.State == balancer.StateReady && !be.Stale && !be.Ledger.Ejected()
	}
	for !inRotation() {
		advance(10 * time.Millisecond)
	}

	var (
		mu   sync.Mutex
		reqs []rotationRequest
	)
	clientsCtx, stopClients := context.WithCancel(context.Background())
	defer stopClients()
	var clients sync.WaitGroup
	for range f.clients {
		clients.Go(func() {
			for clientsCtx.Err() == nil {
				r := rotationStream(client)
				mu.Lock()
				reqs = append(reqs, r)
				mu.Unlock()
			}
		})
	}
	advance(time.Second) // the fleet serves a second before the fault

	broke := time.Now()
	faulty.SetFaults(faults)
	// sim's refuse closes a TCP socket; on the pipe network the listener
	// is closed and every open connection cut, and the loop below
	// listens again when the fault ends.
	refusing := faults[0].Kind == sim.FaultRefuse
	if refusing {
		badLn.kill()
	}
	recovered := broke.Add(faultFor)

	// When the faulty backend left rotation and returned, looked at every
	// 5 ms of virtual time; then it must serve again.
	var out, back time.Time
	var servedBefore int64
	for deadline := recovered.Add(10 * time.Second); time.Now().Before(deadline); advance(5 * time.Millisecond) {
		if refusing && !time.Now().Before(recovered) {
			refusing = false
			go servers[2].Serve(&killableListener{Listener: pn.Listen("gpu-2:80")})
		}
		in := inRotation()
		if out.IsZero() && !in {
			out = time.Now()
		}
		if !out.IsZero() && back.IsZero() && in && !time.Now().Before(recovered) {
			back, servedBefore = time.Now(), badBackend().Ledger.Total()
		}
		if !back.IsZero() && badBackend().Ledger.Total() > servedBefore {
			break
		}
	}
	stopClients()
	clients.Wait()
	synctest.Wait() // every handler has returned

	if out.IsZero() {
		t.Fatal("the faulty backend never left rotation")
	}
	if took, within := out.Sub(broke), rc.wantOutWithin(f); took > within {
		t.Errorf("the faulty backend left rotation %s after the fault began, want within %s", took, within)
	}
	// Readmission: a readmission probe sent just before the fault ended
	// fails at readmit_timeout at worst and ejects the backend again, for
	// at most EjectBackoffMax; the next scrape tick probes it again, and
	// the probe's own 4-token stream takes 40 ms.
	if back.IsZero() {
		t.Errorf("the faulty backend did not return within 10s of recovering")
	} else if took, within := back.Sub(recovered), f.scrape.ReadmitTimeout+f.bal.Passive.EjectBackoffMax+nextScrape(f)+100*time.Millisecond; took > within {
		t.Errorf("the faulty backend returned %s after the fault ended, want within %s", took, within)
	} else if badBackend().Ledger.Total() == servedBefore {
		t.Errorf("the faulty backend served no request after it returned")
	}

	failed := 0
	var late []rotationRequest
	for _, r := range reqs {
		if r.err == "" {
			continue
		}
		failed++
		if !rc.mayFail || !r.start.Before(out) {
			late = append(late, r)
		}
	}
	if len(late) > 0 {
		t.Errorf("%d of %d client requests failed that should not have (out of rotation %s after the fault); first, started %s after it: %s",
			len(late), len(reqs), out.Sub(broke), late[0].start.Sub(broke), late[0].err)
	}
	for _, be := range bal.Snapshot().Backends {
		if n := be.Ledger.InFlight(); n != 0 {
			t.Errorf("%s: %d in flight after every client finished", be.ID, n)
		}
	}
	t.Logf("%d requests, %d failed; out of rotation %s after the fault, back %s after it ended",
		len(reqs), failed, out.Sub(broke), back.Sub(recovered))
}

// rotationStream sends one streaming completion through llmlb on the pipe
// network and reads it to its end.
func rotationStream(client *http.Client) rotationRequest {
	r := rotationRequest{start: time.Now()}
	resp, err := client.Post("http://llmlb:80/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"tell me a story","max_tokens":8,"stream":true}`))
	if err != nil {
		r.err = err.Error()
		return r
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode != http.StatusOK:
		r.err = fmt.Sprintf("status %d: %.200s", resp.StatusCode, b)
	case err != nil:
		r.err = "stream: " + err.Error()
	case !strings.HasSuffix(string(b), "data: [DONE]\n\n"):
		r.err = "stream ended without [DONE]"
	}
	return r
}
