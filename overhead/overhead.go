package overhead

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmlb/llmlb/bench"
	"github.com/llmlb/llmlb/sim"
)

// Options choose what `llmlb overhead` runs.
type Options struct {
	// LLMLB is the llmlb executable to run as a proxy (`serve`); "" skips
	// it.
	LLMLB string
	// Proxies are the rows: "direct", "llmlb", "go", "haproxy", "nginx".
	Proxies []string
	// Duration is how long each scenario runs against each proxy.
	Duration time.Duration
	// Scale multiplies the clients of the concurrent scenarios (below 1
	// for a smoke run); 1 is the full benchmark.
	Scale float64
	// Require makes a proxy that is not installed an error instead of a
	// skipped row.
	Require bool
	// Scenarios, if set, are the names of the scenarios to run (see
	// [Scenarios]); empty runs every one.
	Scenarios []string
	// ProfileDir, if set, gets llmlb's CPU profile of each scenario,
	// taken from its admin listener's pprof while the load runs, as
	// llmlb-<scenario>.pprof (`go tool pprof` reads it). Profiling costs
	// llmlb CPU of its own: compare CPU figures of runs without it.
	ProfileDir string
	// Progress, if set, gets a line as each cell finishes.
	Progress io.Writer
}

// Scenario is one column group of the overhead table.
type Scenario struct {
	Name    string
	Path    string // "" is /v1/completions
	Clients int
	Body    []byte
	// Bodies, if set, are the clients' bodies (see [Load]).
	Bodies [][]byte
	Stream bool
	// PerClient, if above 0, is how many requests each client sends;
	// 0 runs for the duration.
	PerClient int
}

// Scenarios are the scenarios of DESIGN.md's overhead benchmark:
// added latency at low concurrency, throughput at high concurrency, long
// prompts, and many concurrent streams. The backend answers one token at
// once; streams ask for 50, which it paces 10ms apart, as a busy server
// does. long-chat is issue 19's agent load: 150 clients at once, each
// sending its own 220 KB chat prompt 4 times as a stream of one token,
// timed to the first token.
func Scenarios(scale float64) []Scenario {
	clients := func(n int) int { return max(1, int(float64(n)*scale)) }
	small := completionBody(1024, false)
	chats := make([][]byte, clients(150))
	for i := range chats {
		chats[i] = chatBody(uint64(i), 220<<10)
	}
	return []Scenario{
		{Name: "latency", Clients: 1, Body: small},
		{Name: "throughput", Clients: clients(64), Body: small},
		{Name: "long-prompt", Clients: clients(8), Body: completionBody(256<<10, false)},
		{Name: "long-chat", Path: "/v1/chat/completions", Clients: len(chats), Bodies: chats, Stream: true, PerClient: 4},
		{Name: "streams", Clients: clients(256), Body: completionBody(1024, true), Stream: true},
	}
}

// chatBody is a streamed /v1/chat/completions request for one token
// whose system and user messages hold n bytes of text between them: a
// 16 KB system prompt every client shares, then a user message of its
// own (client seeds its text).
func chatBody(client uint64, n int) []byte {
	const system = 16 << 10
	sys := (&bench.Request{Parts: []bench.Part{{ID: 76, Tokens: system / 4}}}).AppendText(nil)
	user := (&bench.Request{Parts: []bench.Part{{ID: 1000 + client, Tokens: (n - system) / 4}}}).AppendText(nil)
	b, _ := json.Marshal(map[string]any{"model": bench.Model, "stream": true, "max_tokens": 1,
		"messages": []map[string]string{{"role": "system", "content": string(sys)}, {"role": "user", "content": string(user)}}})
	return b
}

// completionBody is a /v1/completions request with a prompt of n bytes.
func completionBody(n int, stream bool) []byte {
	prompt := (&bench.Request{Parts: []bench.Part{{ID: 77, Tokens: n / 4}}}).AppendText(nil)
	req := map[string]any{"model": bench.Model, "prompt": string(prompt), "max_tokens": 1}
	if stream {
		req["stream"] = true
		req["max_tokens"] = 50
	}
	b, _ := json.Marshal(req)
	return b
}

// Cell is one scenario against one proxy. Times are seconds.
type Cell struct {
	Scenario   string  `json:"scenario"`
	Clients    int     `json:"clients"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	PerSecond  float64 `json:"requests_per_s"`
	P50        float64 `json:"latency_p50"`
	P99        float64 `json:"latency_p99"`
	TTFTP50    float64 `json:"ttft_p50,omitempty"`
	TTFTP90    float64 `json:"ttft_p90,omitempty"`
	TTFTP99    float64 `json:"ttft_p99,omitempty"`
	GapP99     float64 `json:"gap_p99,omitempty"`
	EventsPerS float64 `json:"events_per_s,omitempty"`
	// CPUPerRequest is the proxy's processes' user plus system CPU time
	// over the cell, from /proc, divided by the requests answered; 0 for
	// the direct row, which has no proxy process.
	CPUPerRequest float64 `json:"cpu_per_request,omitempty"`
	// PeakRSS is the sum of the proxy's processes' resident-set peaks
	// (VmHWM) during the cell, in bytes; 0 for the direct row.
	PeakRSS    int64  `json:"peak_rss_bytes,omitempty"`
	FirstError string `json:"first_error,omitempty"`
}

// Row is one proxy's results.
type Row struct {
	Proxy   string `json:"proxy"`
	Version string `json:"version"`
	Skipped string `json:"skipped,omitempty"` // why there are no cells
	Cells   []Cell `json:"cells"`
}

// Report is the whole run.
type Report struct {
	Duration float64 `json:"seconds_per_cell"`
	Rows     []Row   `json:"rows"`
}

// Run starts a fast emulated backend, puts each proxy in front of it
// and runs every scenario through each, one at a time.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Duration <= 0 {
		o.Duration = 5 * time.Second
	}
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if len(o.Proxies) == 0 {
		o.Proxies = []string{"direct", "llmlb", "go", "haproxy", "nginx"}
	}
	rep := Report{Duration: o.Duration.Seconds()}
	dir, err := os.MkdirTemp("", "llmlb-overhead-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)

	backend, stopBackend, err := fastBackend()
	if err != nil {
		return rep, err
	}
	defer stopBackend()

	scenarios, err := pickScenarios(Scenarios(o.Scale), o.Scenarios)
	if err != nil {
		return rep, err
	}
	for _, name := range o.Proxies {
		row := Row{Proxy: name}
		admin := ""
		if name == "llmlb" && o.ProfileDir != "" {
			port, err := freePort()
			if err != nil {
				return rep, err
			}
			admin = fmt.Sprintf("127.0.0.1:%d", port)
		}
		url, version, pid, stop, err := startProxy(ctx, name, o.LLMLB, backend, dir, admin)
		var missing errMissing
		switch {
		case errors.As(err, &missing) && !o.Require:
			row.Skipped = err.Error()
			rep.Rows = append(rep.Rows, row)
			continue
		case err != nil:
			return rep, fmt.Errorf("overhead: %s: %w", name, err)
		}
		row.Version = version
		for _, sc := range scenarios {
			path := cmp.Or(sc.Path, "/v1/completions")
			var before procUsage
			if pid > 0 {
				resetPeaks(pid)
				before, _ = usageOf(pid)
			}
			var profiled chan error // the profile taken while the load runs
			if admin != "" {
				profiled = make(chan error, 1)
				go func() {
					profiled <- saveProfile(ctx, admin, o.Duration, filepath.Join(o.ProfileDir, "llmlb-"+sc.Name+".pprof"))
				}()
			}
			res := Load{URL: url + path, Body: sc.Body, Bodies: sc.Bodies, Stream: sc.Stream, Clients: sc.Clients, Duration: o.Duration, PerClient: sc.PerClient}.Run(ctx)
			if profiled != nil {
				if err := <-profiled; err != nil {
					stop()
					return rep, fmt.Errorf("overhead: profile of %s: %w", sc.Name, err)
				}
			}
			cell := Cell{Scenario: sc.Name, Clients: sc.Clients, Requests: res.Requests, Errors: res.Errors, FirstError: res.FirstErr,
				PerSecond: float64(res.Requests) / res.Elapsed.Seconds(), P50: bench.Quantile(res.Latency, .5), P99: bench.Quantile(res.Latency, .99)}
			if pid > 0 {
				if after, ok := usageOf(pid); ok {
					cell.PeakRSS = after.PeakRSS
					if res.Requests > 0 {
						cell.CPUPerRequest = (after.CPU - before.CPU).Seconds() / float64(res.Requests)
					}
				}
			}
			if sc.Stream {
				cell.TTFTP50, cell.TTFTP90, cell.TTFTP99 = bench.Quantile(res.TTFT, .5), bench.Quantile(res.TTFT, .9), bench.Quantile(res.TTFT, .99)
				if len(res.Gaps) > 0 { // none when streams are one token long; JSON has no NaN
					cell.GapP99 = bench.Quantile(res.Gaps, .99)
				}
				cell.EventsPerS = float64(res.Events) / res.Elapsed.Seconds()
			}
			row.Cells = append(row.Cells, cell)
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "overhead: %s %s: %d requests, %d errors\n", name, sc.Name, res.Requests, res.Errors)
			}
			if ctx.Err() != nil {
				break
			}
		}
		stop()
		rep.Rows = append(rep.Rows, row)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// fastBackend serves the OpenAI API on a loopback port from an emulated
// vLLM server whose first token comes at once and each next one 10ms
// later, and returns its base URL. Its KV cache (16M tokens) holds every
// prompt the scenarios have in flight at once (150 220 KB chats are 8.4M
// tokens), as a server this fast would: with the default 131k tokens,
// llmlb's saturation filter held most long prompts in its admission
// queue, which HAProxy and nginx do not have.
func fastBackend() (string, func(), error) {
	model := sim.NewSteady(sim.SteadyConfig{DecodeTokensPerSecond: 100, PrefillTokensPerSecond: 1e12,
		FirstTokenLatency: time.Nanosecond, MaxRunning: 1 << 16, NumBlocks: 1 << 20})
	srv, err := sim.NewServer(sim.ServerConfig{Model: bench.Model}, model)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { hs.Close() }, nil
}

// errMissing is a proxy that is not installed.
type errMissing struct{ name string }

func (e errMissing) Error() string { return e.name + " is not installed" }

// pickScenarios returns the scenarios of all that names asks for, in
// their order; no names is every one.
func pickScenarios(all []Scenario, names []string) ([]Scenario, error) {
	if len(names) == 0 {
		return all, nil
	}
	var out []Scenario
	for _, n := range names {
		i := slices.IndexFunc(all, func(sc Scenario) bool { return sc.Name == n })
		if i < 0 {
			known := make([]string, len(all))
			for j, sc := range all {
				known[j] = sc.Name
			}
			return nil, fmt.Errorf("overhead: no scenario %q (scenarios: %s)", n, strings.Join(known, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// saveProfile asks the llmlb admin listener at admin for a CPU profile
// of the next d and writes it to path.
func saveProfile(ctx context.Context, admin string, d time.Duration, path string) error {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof answered %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startProxy starts the named proxy in front of backend and returns its
// base URL, its version, its process id (0 for direct) and how to stop it.
// admin, for llmlb, is the address of its admin listener ("" for none).
func startProxy(ctx context.Context, name, llmlb, backend, dir, admin string) (url, version string, pid int, stop func(), err error) {
	host := strings.TrimPrefix(backend, "http://")
	switch name {
	case "direct":
		return backend, "-", 0, func() {}, nil
	case "llmlb":
		if llmlb == "" {
			return "", "", 0, nil, errMissing{"llmlb"}
		}
		// The saturation queue threshold is HAProxy's server maxconn
		// below: each proxy queues requests only past 4,096 at the
		// backend. With the default 16, llmlb's ledger counts every
		// request it sent and has no first byte for yet as queued, so 64
		// clients kept it queueing in its admission queue: routing
		// policy, not what proxying costs.
		cfg := fmt.Sprintf("listen: 127.0.0.1:0\nadmin:\n  listen: %q\nlog:\n  level: warn\n  access: false\nbalancer:\n  saturation:\n    queue: 4096\nbackends:\n  - url: %s\n", admin, backend)
		path := filepath.Join(dir, "llmlb.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return "", "", 0, nil, err
		}
		return startProcess(ctx, llmlb, []string{"serve", "--config", path}, "", "llmlb")
	case "go":
		if llmlb == "" {
			return "", "", 0, nil, errMissing{"go"}
		}
		return startProcess(ctx, llmlb, []string{"overhead", "--go-proxy", backend}, "", "go")
	case "haproxy":
		bin, err := findBinary("haproxy")
		if err != nil {
			return "", "", 0, nil, err
		}
		port, err := freePort()
		if err != nil {
			return "", "", 0, nil, err
		}
		cfg := fmt.Sprintf(`global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    option http-keep-alive
    option http-no-delay
frontend fe
    bind 127.0.0.1:%d
    default_backend be
backend be
    balance leastconn
    http-reuse safe
    server s1 %s maxconn 4096
`, port, host)
		path := filepath.Join(dir, "haproxy.cfg")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return "", "", 0, nil, err
		}
		return startProcess(ctx, bin, []string{"-db", "-f", path}, fmt.Sprintf("127.0.0.1:%d", port), "haproxy")
	case "nginx":
		bin, err := findBinary("nginx")
		if err != nil {
			return "", "", 0, nil, err
		}
		port, err := freePort()
		if err != nil {
			return "", "", 0, nil, err
		}
		ndir := filepath.Join(dir, "nginx")
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return "", "", 0, nil, err
		}
		// Streams need proxy_buffering off; request bodies up to 1 MiB
		// stay in memory, as llmlb and HAProxy keep them.
		cfg := fmt.Sprintf(`worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    client_max_body_size 32m;
    client_body_buffer_size 1m;
    keepalive_requests 100000;
    upstream be {
        least_conn;
        server %[2]s;
        keepalive 512;
    }
    server {
        listen 127.0.0.1:%[3]d;
        location / {
            proxy_pass http://be;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }
    }
}
`, ndir, host, port)
		path := filepath.Join(ndir, "nginx.conf")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return "", "", 0, nil, err
		}
		return startProcess(ctx, bin, []string{"-p", ndir, "-c", path, "-e", filepath.Join(ndir, "error.log"), "-g", "daemon off;"}, fmt.Sprintf("127.0.0.1:%d", port), "nginx")
	}
	return "", "", 0, nil, fmt.Errorf("unknown proxy %q (have direct, llmlb, go, haproxy, nginx)", name)
}

// findBinary looks for a proxy in PATH, then in /usr/sbin, where Debian
// installs both and where a user's PATH often does not reach.
func findBinary(name string) (string, error) {
	if bin, err := exec.LookPath(name); err == nil {
		return bin, nil
	}
	bin := filepath.Join("/usr/sbin", name)
	if fi, err := os.Stat(bin); err == nil && !fi.IsDir() {
		return bin, nil
	}
	return "", errMissing{name}
}

// startProcess runs bin with args until stop, and waits until it answers a
// completion. With addr "" the address is read from the process's
// "serving on http://ADDR" line (llmlb picks its own port). It returns the
// URL, the version, the process id and the stop function.
func startProcess(ctx context.Context, bin string, args []string, addr, name string) (string, string, int, func(), error) {
	version := versionOf(bin, name)
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", 0, nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedWriter{b: &stderr, n: 4096}
	if err := cmd.Start(); err != nil {
		return "", "", 0, nil, err
	}
	exited := make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, rest, ok := strings.Cut(sc.Text(), "serving on http://"); ok {
				a, _, _ := strings.Cut(rest, " ")
				select {
				case found <- a:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	fail := func(err error) (string, string, int, func(), error) {
		stop()
		return "", "", 0, nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	deadline := time.After(15 * time.Second)
	if addr == "" {
		select {
		case addr = <-found:
		case <-exited:
			return fail(errors.New("exited before serving"))
		case <-deadline:
			return fail(errors.New("did not say where it serves within 15s"))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	url := "http://" + addr
	body := completionBody(64, false)
	for {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, version, cmd.Process.Pid, stop, nil
			}
		}
		select {
		case <-exited:
			return fail(errors.New("exited"))
		case <-deadline:
			return fail(fmt.Errorf("no answer within 15s (last: %v)", err))
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// versionOf returns the first line a proxy prints of its version.
func versionOf(bin, name string) string {
	var args []string
	switch name {
	case "haproxy", "nginx":
		args = []string{"-v"}
	case "go":
		return "httputil.ReverseProxy" // built into the llmlb executable that runs it
	default:
		return "this build"
	}
	out, _ := exec.Command(bin, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type limitedWriter struct {
	b *strings.Builder
	n int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if room := w.n - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Write prints the report as two tables, one row a proxy. The first:
// latency at one client, requests per second at high concurrency and with
// long prompts, and first-token and inter-token times of concurrent
// streams. The second: first-token times of the long chat prompts, and
// each scenario's CPU time per request and the peak resident set.
func Write(w io.Writer, rep Report) {
	ms := func(s float64) string {
		if math.IsNaN(s) {
			return "-"
		}
		return fmt.Sprintf("%.2fms", s*1000)
	}
	num := func(x float64) string {
		if math.IsNaN(x) {
			return "-"
		}
		return fmt.Sprintf("%.0f", x)
	}
	us := func(s float64) string {
		if s == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0fµs", s*1e6)
	}
	head := []string{"proxy", "lat p50", "p99", "added p50", "rps", "p99", "256KB rps", "p50", "streams ttft p50", "p99", "gap p99", "events/s", "errors"}
	head2 := []string{"proxy", "220KB chat ttft p50", "p90", "p99", "rps", "cpu/req: lat", "rps", "256KB", "220KB chat", "streams", "peak rss"}
	if len(rep.Rows) > 0 {
		for _, c := range rep.Rows[0].Cells {
			switch c.Scenario {
			case "throughput":
				head[4] = fmt.Sprintf("rps@%d", c.Clients)
			case "streams":
				head[8] = fmt.Sprintf("%d streams ttft p50", c.Clients)
			case "long-chat":
				head2[1] = fmt.Sprintf("220KB chat@%d ttft p50", c.Clients)
			}
		}
	}
	var direct float64 = math.NaN()
	rows, rows2 := [][]string{head}, [][]string{head2}
	for _, r := range rep.Rows {
		if r.Skipped != "" {
			rows = append(rows, []string{r.Proxy, "skipped: " + r.Skipped})
			continue
		}
		by := map[string]Cell{}
		errs := 0
		var peak int64
		for _, c := range r.Cells {
			by[c.Scenario] = c
			errs += c.Errors
			peak = max(peak, c.PeakRSS)
		}
		cell := func(name string) Cell { // a scenario not run (--scenario) prints as -
			if c, ok := by[name]; ok {
				return c
			}
			nan := math.NaN()
			return Cell{P50: nan, P99: nan, PerSecond: nan, TTFTP50: nan, TTFTP90: nan, TTFTP99: nan, GapP99: nan, EventsPerS: nan}
		}
		lat, thr, long, chat, st := cell("latency"), cell("throughput"), cell("long-prompt"), cell("long-chat"), cell("streams")
		if r.Proxy == "direct" {
			direct = lat.P50
		}
		added := "-"
		if !math.IsNaN(direct) && !math.IsNaN(lat.P50) && r.Proxy != "direct" {
			added = fmt.Sprintf("%+.2fms", (lat.P50-direct)*1000)
		}
		rows = append(rows, []string{r.Proxy, ms(lat.P50), ms(lat.P99), added, num(thr.PerSecond), ms(thr.P99),
			num(long.PerSecond), ms(long.P50), ms(st.TTFTP50), ms(st.TTFTP99), ms(st.GapP99), num(st.EventsPerS), fmt.Sprint(errs)})
		rss := "-"
		if peak > 0 {
			rss = fmt.Sprintf("%.0fMB", float64(peak)/(1<<20))
		}
		rows2 = append(rows2, []string{r.Proxy, ms(chat.TTFTP50), ms(chat.TTFTP90), ms(chat.TTFTP99), num(chat.PerSecond),
			us(lat.CPUPerRequest), us(thr.CPUPerRequest), us(long.CPUPerRequest), us(chat.CPUPerRequest), us(st.CPUPerRequest), rss})
	}
	fmt.Fprintf(w, "\noverhead: one fast emulated vLLM backend on loopback, %gs a cell (220KB chat: 4 requests a client)\n", rep.Duration)
	writeTable(w, rows)
	fmt.Fprintln(w)
	writeTable(w, rows2)
	for _, r := range rep.Rows {
		for _, c := range r.Cells {
			if c.FirstError != "" {
				fmt.Fprintf(w, "%s %s: first error: %s\n", r.Proxy, c.Scenario, c.FirstError)
			}
		}
	}
}

// writeTable prints rows in aligned columns, the first left-aligned and
// the others right-aligned; a row shorter than the first (a skipped
// proxy) is printed as it is.
func writeTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		if len(row) != len(widths) {
			continue
		}
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", max(0, widths[min(i, len(widths)-1)]-utf8.RuneCountInString(c)))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			case len(row) != len(widths):
				b.WriteString("  " + c)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}
