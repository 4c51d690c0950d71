package scrape

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/internal/pipenet"
)

// fakeDNS answers discovery's lookups as a DNS server would, from A and
// SRV records the test sets and may change while discovery runs: a name
// without addresses is NXDOMAIN, and fail makes every lookup a server
// failure. It stands in for the network's resolver, whose sockets would
// hold up a synctest bubble's clock.
type fakeDNS struct {
	mu   sync.Mutex
	a    map[string][]net.IP   // guarded by mu; by name
	srv  map[string][]*net.SRV // guarded by mu; by name
	fail bool                  // guarded by mu
}

var _ Resolver = (*fakeDNS)(nil)

func newFakeDNS() *fakeDNS {
	return &fakeDNS{a: map[string][]net.IP{}, srv: map[string][]*net.SRV{}}
}

func (d *fakeDNS) setA(name string, ips ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = nil
	for _, ip := range ips {
		d.a[name] = append(d.a[name], net.ParseIP(ip))
	}
}

func (d *fakeDNS) setSRV(name string, targets ...net.SRV) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.srv[name] = nil
	for _, s := range targets {
		s.Target += "." // as a DNS answer spells it
		d.srv[name] = append(d.srv[name], &s)
	}
}

func (d *fakeDNS) setFail(f bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail = f
}

// lookupErr is the error net.Resolver returns for a failing server, or
// for a name without records.
func (d *fakeDNS) lookupErr(name string, found bool) error {
	switch {
	case d.fail:
		return &net.DNSError{Err: "server misbehaving", Name: name, IsTemporary: true}
	case !found:
		return &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return nil
}

func (d *fakeDNS) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.lookupErr(host, len(d.a[host]) > 0); err != nil {
		return nil, err
	}
	out := make([]net.IPAddr, 0, len(d.a[host]))
	for _, ip := range d.a[host] {
		out = append(out, net.IPAddr{IP: ip})
	}
	return out, nil
}

func (d *fakeDNS) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.lookupErr(name, len(d.srv[name]) > 0); err != nil {
		return "", nil, err
	}
	return name + ".", slices.Clone(d.srv[name]), nil
}

// bubbleNet is an in-memory network for a synctest bubble: HTTP servers
// listening on it at the addresses a backend URL names, and a client that
// dials them. Its servers close and its idle connections go when the
// test ends, so that no goroutine outlives the bubble.
type bubbleNet struct {
	pn      pipenet.Network
	client  *http.Client
	servers []*http.Server
}

func newBubbleNet(t *testing.T) *bubbleNet {
	n := &bubbleNet{}
	tr := &http.Transport{DialContext: n.pn.DialContext}
	n.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		for _, hs := range n.servers {
			hs.Close()
		}
	})
	return n
}

// serve serves h at hostport and returns its URL.
func (n *bubbleNet) serve(hostport string, h http.Handler) string {
	hs := &http.Server{Handler: h}
	n.servers = append(n.servers, hs)
	go hs.Serve(n.pn.Listen(hostport))
	return "http://" + hostport
}

// hostBackends serves n backends on 127.0.0.1, at ports 8001 on, each
// answering health, models and metrics, and a slow completion that blocks
// until release is called (at the latest when the test ends). It returns
// their ports and release.
func hostBackends(t *testing.T, bn *bubbleNet, n int) ([]int, func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(ch) }) }
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			io.WriteString(w, `{"data":[{"id":"m"}]}`)
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
		default:
			<-ch
		}
	})
	var ports []int
	for i := range n {
		ports = append(ports, 8001+i)
		bn.serve("127.0.0.1:"+strconv.Itoa(8001+i), h)
	}
	t.Cleanup(release) // runs before the servers close
	return ports, release
}

// ids lists the snapshot's backends in a state.
func ids(bal *balancer.Balancer, state balancer.State) []string {
	var out []string
	for _, be := range bal.Snapshot().Backends {
		if be.State == state {
			out = append(out, be.ID)
		}
	}
	return out
}

// waitFor moves the bubble's clock on 10 ms at a time until cond, which
// reads the balancer's published state, holds, and fails t after 10 s of
// it. Call it only from the bubble's root goroutine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for waited := time.Duration(0); !cond(); waited += 10 * time.Millisecond {
		if waited >= 10*time.Second {
			t.Fatalf("%s: not within 10s", what)
		}
		advance(10 * time.Millisecond)
	}
}

func dnsConfig() Config {
	cfg := DefaultConfig()
	cfg.DNSInterval = 50 * time.Millisecond
	cfg.Interval = 20 * time.Millisecond
	cfg.HealthInterval = 100 * time.Millisecond
	return cfg
}

func runManager(t *testing.T, bn *bubbleNet, cfg Config, bcs []BackendConfig, r Resolver) (*balancer.Balancer, *syncLog) {
	t.Helper()
	bal, logs, _ := runManagerReg(t, bn, cfg, bcs, r)
	return bal, logs
}

// runManagerReg runs a manager of bcs, discovered through r and reached
// through bn, until the test ends. It returns the balancer it feeds, the
// log of both, and the registry holding the manager's metrics.
func runManagerReg(t *testing.T, bn *bubbleNet, cfg Config, bcs []BackendConfig, r Resolver) (*balancer.Balancer, *syncLog, *prometheus.Registry) {
	t.Helper()
	logs := new(syncLog)
	bal, err := balancer.New(balancer.DefaultConfig(), balancer.Deps{}, nil, logs.logger())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewManager(Setup{Config: cfg, Backends: bcs, DefaultEngine: "vllm", Balancer: bal, Resolver: r, Client: bn.client, Logger: logs.logger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return bal, logs, reg
}

// reasonOf returns the state reason of backend id, "" if it is gone.
func reasonOf(bal *balancer.Balancer, id string) string {
	for _, be := range bal.Snapshot().Backends {
		if be.ID == id {
			return be.Reason
		}
	}
	return ""
}

// TestDNSDiscoveryAddsAndDrains drives discovery of one name, in virtual
// time: records added become backends (after their first probe), records
// removed are drained without failing the request in flight and then
// removed, logged once, active_ports is honoured and a failed lookup
// keeps the last set.
func TestDNSDiscoveryAddsAndDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bn := newBubbleNet(t)
		ports, release := hostBackends(t, bn, 3) // all on 127.0.0.1
		d := newFakeDNS()
		d.setA("vllm.test", "127.0.0.1")
		url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }

		bal, logs := runManager(t, bn, dnsConfig(), []BackendConfig{{
			DNS: "vllm.test", Ports: ports,
			// Only the first two ports carry traffic on this host.
			ActivePorts: map[string][]int{"127.0.0.1": ports[:2]},
		}}, d)
		want := []string{url(ports[0]), url(ports[1])}
		slices.Sort(want)
		waitFor(t, "two ready backends", func() bool { return slices.Equal(ids(bal, balancer.StateReady), want) })
		for _, be := range bal.Snapshot().Backends {
			if be.ID == url(ports[2]) {
				t.Fatalf("inactive port %d became a backend", ports[2])
			}
		}

		// A request in flight on the first backend.
		pick := bal.Snapshot().Backends[0]
		guard := balancer.NewGuard()
		guard.Attach(pick, balancer.Work{}, time.Now())
		reqDone := make(chan error, 1)
		go func() {
			resp, err := bn.client.Post(pick.ID+"/v1/completions", "application/json", strings.NewReader(`{}`))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = errors.New(resp.Status)
				}
			}
			guard.Release()
			reqDone <- err
		}()

		// The name's records go away; lookups then fail: the set is kept.
		d.setFail(true)
		advance(200 * time.Millisecond) // four refresh intervals of failing lookups
		if got := ids(bal, balancer.StateReady); !slices.Equal(got, want) {
			t.Fatalf("after failed lookups: ready %v, want the last good set %v", got, want)
		}
		d.setFail(false)
		d.setA("vllm.test") // name exists, no addresses
		waitFor(t, "the busy backend draining, the idle one removed", func() bool { return len(ids(bal, balancer.StateDraining)) == 1 && len(bal.Snapshot().Backends) == 1 })
		if got := ids(bal, balancer.StateDraining); got[0] != pick.ID {
			t.Fatalf("draining %v, want the one with a request in flight (%s)", got, pick.ID)
		}
		if r := reasonOf(bal, pick.ID); r != reasonLeftDiscovery {
			t.Errorf("draining backend's reason %q, want %q", r, reasonLeftDiscovery)
		}
		release()
		if err := <-reqDone; err != nil {
			t.Fatalf("in-flight request failed while its backend drained: %v", err)
		}
		waitFor(t, "drained backend removed", func() bool { return len(bal.Snapshot().Backends) == 0 })
		for _, id := range want {
			// Newcomer trial item 6: scrape and the balancer both logged it.
			if n := strings.Count(logs.String(), `msg="backend removed" backend=`+id+"\n"); n != 1 {
				t.Errorf("%s: backend removed logged %d times, want once:\n%s", id, n, logs.String())
			}
		}

		// A record appears again.
		d.setA("vllm.test", "127.0.0.1")
		waitFor(t, "backends back", func() bool { return slices.Equal(ids(bal, balancer.StateReady), want) })
	})
}

// TestSRVDiscovery: SRV targets become backends at their ports, resolved
// through their A records; active_ports can name the SRV target.
func TestSRVDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bn := newBubbleNet(t)
		ports, _ := hostBackends(t, bn, 3)
		d := newFakeDNS()
		d.setA("node-a.test", "127.0.0.1")
		d.setSRV("_vllm._tcp.test",
			net.SRV{Target: "node-a.test", Port: uint16(ports[0])},
			net.SRV{Target: "node-a.test", Port: uint16(ports[1])})
		bal, _ := runManager(t, bn, dnsConfig(), []BackendConfig{{SRV: "_vllm._tcp.test"}}, d)
		url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
		want := []string{url(ports[0]), url(ports[1])}
		slices.Sort(want)
		waitFor(t, "SRV backends ready", func() bool { return slices.Equal(ids(bal, balancer.StateReady), want) })

		d.setSRV("_vllm._tcp.test", net.SRV{Target: "node-a.test", Port: uint16(ports[1])}, net.SRV{Target: "node-a.test", Port: uint16(ports[2])})
		want = []string{url(ports[1]), url(ports[2])}
		slices.Sort(want)
		waitFor(t, "SRV set replaced", func() bool {
			var all []string
			for _, be := range bal.Snapshot().Backends {
				all = append(all, be.ID)
			}
			return slices.Equal(all, want) && slices.Equal(ids(bal, balancer.StateReady), want)
		})
	})
}

// TestDNSNameThatDoesNotResolve: a name with no records from the start is
// logged once, counted, and leaves no backends, and nothing panics.
func TestDNSNameThatDoesNotResolve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newFakeDNS()
		bal, logs, reg := runManagerReg(t, newBubbleNet(t), dnsConfig(), []BackendConfig{{DNS: "nowhere.test", Ports: []int{8000}}}, d)
		synctest.Wait()
		if !strings.Contains(logs.String(), "resolves to no backends") {
			t.Errorf("the empty answer was not logged:\n%s", logs.String())
		}
		if n := len(bal.Snapshot().Backends); n != 0 {
			t.Errorf("%d backends from a name that does not resolve", n)
		}
		advance(150 * time.Millisecond) // three refresh intervals
		if n := strings.Count(logs.String(), "resolves to no backends"); n != 1 {
			t.Errorf("empty answer logged %d times, want once", n)
		}
		d.setFail(true)
		advance(50 * time.Millisecond)
		if !strings.Contains(logs.String(), "discovery lookup failing") {
			t.Errorf("the server failure was not logged:\n%s", logs.String())
		}
		// The failures are counted, and the empty answer set the gauge to 0.
		if n, err := testutil.GatherAndCount(reg, "llmlb_discovery_dns_errors_total", "llmlb_discovery_dns_backends"); err != nil || n != 2 {
			t.Errorf("DNS metrics: %d series (%v), want the error counter and the backends gauge", n, err)
		}
	})
}
