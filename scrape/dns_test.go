package scrape

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/llmlb/llmlb/balancer"
)

// dnsServer is a small authoritative DNS server over UDP for tests: A
// records and SRV records by name, changeable while it runs, and a switch
// that makes it answer SERVFAIL.
type dnsServer struct {
	conn net.PacketConn

	mu   sync.Mutex
	a    map[string][]net.IP // guarded by mu; FQDN -> addresses
	srv  map[string][]net.SRV
	fail bool
}

func newDNSServer(t *testing.T) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{conn: conn, a: map[string][]net.IP{}, srv: map[string][]net.SRV{}}
	go d.serve()
	t.Cleanup(func() { conn.Close() })
	return d
}

func (d *dnsServer) setA(name string, ips ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name+"."] = nil
	for _, ip := range ips {
		d.a[name+"."] = append(d.a[name+"."], net.ParseIP(ip))
	}
}

func (d *dnsServer) setSRV(name string, targets ...net.SRV) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.srv[name+"."] = targets
}

func (d *dnsServer) setFail(f bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail = f
}

// resolver returns a Go resolver that asks only this server.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", d.conn.LocalAddr().String())
	}}
}

func (d *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, addr, err := d.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, err := d.answer(buf[:n]); err == nil {
			_, _ = d.conn.WriteTo(out, addr)
		}
	}
}

func (d *dnsServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	name := strings.ToLower(q.Name.String())
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: dnsmessage.RCodeSuccess}
	_, knownA := d.a[name]
	_, knownSRV := d.srv[name]
	switch {
	case d.fail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !knownA && !knownSRV:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if rh.RCode == dnsmessage.RCodeSuccess {
		rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
		switch q.Type {
		case dnsmessage.TypeA:
			for _, ip := range d.a[name] {
				if v4 := ip.To4(); v4 != nil {
					_ = b.AResource(rr, dnsmessage.AResource{A: [4]byte(v4)})
				}
			}
		case dnsmessage.TypeAAAA:
			for _, ip := range d.a[name] {
				if ip.To4() == nil {
					_ = b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: [16]byte(ip.To16())})
				}
			}
		case dnsmessage.TypeSRV:
			for _, s := range d.srv[name] {
				_ = b.SRVResource(rr, dnsmessage.SRVResource{Priority: s.Priority, Weight: s.Weight, Port: s.Port, Target: dnsmessage.MustNewName(s.Target + ".")})
			}
		}
	}
	return b.Finish()
}

// hostBackends starts n HTTP backends on 127.0.0.1, one per port, answering
// health, models and metrics, and a slow completion that blocks until
// release is called (at the latest when the test ends). It returns their
// ports and release.
func hostBackends(t *testing.T, n int) ([]int, func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(ch) }) }
	var ports []int
	for range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/health":
			case "/v1/models":
				io.WriteString(w, `{"data":[{"id":"m"}]}`)
			case "/metrics":
				io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
			default:
				<-ch
			}
		}))
		t.Cleanup(srv.Close)
		_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
		port, _ := strconv.Atoi(p)
		ports = append(ports, port)
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

// waitFor polls cond, which reads the balancer's published state, until it
// holds. Discovery runs over a real socket, so this is real time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

func dnsConfig() Config {
	cfg := DefaultConfig()
	cfg.DNSInterval = 50 * time.Millisecond
	cfg.Interval = 20 * time.Millisecond
	cfg.HealthInterval = 100 * time.Millisecond
	return cfg
}

func runManager(t *testing.T, cfg Config, bcs []BackendConfig, r Resolver) (*balancer.Balancer, *syncLog) {
	t.Helper()
	bal, logs, _ := runManagerReg(t, cfg, bcs, r)
	return bal, logs
}

// runManagerReg is runManager that also returns the registry holding the
// manager's metrics.
func runManagerReg(t *testing.T, cfg Config, bcs []BackendConfig, r Resolver) (*balancer.Balancer, *syncLog, *prometheus.Registry) {
	t.Helper()
	bal := testBalancer(t)
	logs := new(syncLog)
	reg := prometheus.NewRegistry()
	m, err := NewManager(Setup{Config: cfg, Backends: bcs, DefaultEngine: "vllm", Balancer: bal, Resolver: r, Logger: logs.logger(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return bal, logs, reg
}

// TestDNSDiscoveryAddsAndDrains drives discovery of one name through a real
// resolver pointed at a DNS server the test runs: records added become
// backends (after their first probe), records removed are drained without
// failing the request in flight, active_ports is honoured and a failed
// lookup keeps the last set.
func TestDNSDiscoveryAddsAndDrains(t *testing.T) {
	ports, release := hostBackends(t, 3) // all on 127.0.0.1
	d := newDNSServer(t)
	d.setA("vllm.test", "127.0.0.1")
	url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }

	bal, _ := runManager(t, dnsConfig(), []BackendConfig{{
		DNS: "vllm.test", Ports: ports,
		// Only the first two ports carry traffic on this host.
		ActivePorts: map[string][]int{"127.0.0.1": ports[:2]},
	}}, d.resolver())
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
		resp, err := http.Post(pick.ID+"/v1/completions", "application/json", strings.NewReader(`{}`))
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
	<-time.After(200 * time.Millisecond) // several refresh intervals of failing lookups
	if got := ids(bal, balancer.StateReady); !slices.Equal(got, want) {
		t.Fatalf("after failed lookups: ready %v, want the last good set %v", got, want)
	}
	d.setFail(false)
	d.setA("vllm.test") // name exists, no addresses
	waitFor(t, "the busy backend draining, the idle one removed", func() bool { return len(ids(bal, balancer.StateDraining)) == 1 && len(bal.Snapshot().Backends) == 1 })
	if got := ids(bal, balancer.StateDraining); got[0] != pick.ID {
		t.Fatalf("draining %v, want the one with a request in flight (%s)", got, pick.ID)
	}
	release()
	if err := <-reqDone; err != nil {
		t.Fatalf("in-flight request failed while its backend drained: %v", err)
	}
	waitFor(t, "drained backend removed", func() bool { return len(bal.Snapshot().Backends) == 0 })

	// A record appears again.
	d.setA("vllm.test", "127.0.0.1")
	waitFor(t, "backends back", func() bool { return slices.Equal(ids(bal, balancer.StateReady), want) })
}

// TestSRVDiscovery: SRV targets become backends at their ports, resolved
// through their A records; active_ports can name the SRV target.
func TestSRVDiscovery(t *testing.T) {
	ports, _ := hostBackends(t, 3)
	d := newDNSServer(t)
	d.setA("node-a.test", "127.0.0.1")
	d.setSRV("_vllm._tcp.test",
		net.SRV{Target: "node-a.test", Port: uint16(ports[0])},
		net.SRV{Target: "node-a.test", Port: uint16(ports[1])})
	bal, _ := runManager(t, dnsConfig(), []BackendConfig{{SRV: "_vllm._tcp.test"}}, d.resolver())
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
}

// TestDNSNameThatDoesNotResolve: a name with no records from the start is
// logged, counted, and leaves no backends, and nothing panics.
func TestDNSNameThatDoesNotResolve(t *testing.T) {
	d := newDNSServer(t)
	bal, logs, reg := runManagerReg(t, dnsConfig(), []BackendConfig{{DNS: "nowhere.test", Ports: []int{8000}}}, d.resolver())
	waitFor(t, "empty answer logged", func() bool { return strings.Contains(logs.String(), "resolves to no backends") })
	if n := len(bal.Snapshot().Backends); n != 0 {
		t.Errorf("%d backends from a name that does not resolve", n)
	}
	<-time.After(150 * time.Millisecond)
	if n := strings.Count(logs.String(), "resolves to no backends"); n != 1 {
		t.Errorf("empty answer logged %d times, want once", n)
	}
	d.setFail(true)
	waitFor(t, "server failure logged", func() bool { return strings.Contains(logs.String(), "discovery lookup failing") })
	// The failures are counted, and the empty answer set the gauge to 0.
	if n, err := testutil.GatherAndCount(reg, "llmlb_discovery_dns_errors_total", "llmlb_discovery_dns_backends"); err != nil || n != 2 {
		t.Errorf("DNS metrics: %d series (%v), want the error counter and the backends gauge", n, err)
	}
}
