package overhead

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/proxy"
)

// errMissing is a proxy that is not installed.
type errMissing struct{ name string }

func (e errMissing) Error() string { return e.name + " is not installed" }

// startProxy starts the named proxy in front of backend and returns its
// base URL, its version, its process id (0 for direct) and how to stop it.
// admin, for llmlb, is the address of its admin listener ("" for none).
func startProxy(ctx context.Context, name, llmlb, backend, dir, admin string) (url, version string, pid int, stop func(), err error) {
	host := strings.TrimPrefix(backend, "http://")
	switch name {
	case "direct":
		return backend, "-", 0, func() {}, nil
	case "llmlb", "llmlb-keyed", "llmlb-redis", "llmlb-capture":
		if llmlb == "" {
			return "", "", 0, nil, errMissing{name}
		}
		redis, stopRedis := "", func() {}
		if name == "llmlb-redis" {
			addr, stop, err := startRedis(ctx, dir)
			if err != nil {
				return "", "", 0, nil, err
			}
			redis, stopRedis = addr, stop
		}
		path, err := writeLLMLBConfig(name, backend, admin, redis, dir)
		if err != nil {
			stopRedis()
			return "", "", 0, nil, err
		}
		url, version, pid, stop, err := startProcess(ctx, llmlb, []string{"serve", "--config", path}, "", name)
		if err != nil {
			stopRedis()
			return "", "", 0, nil, err
		}
		return url, version, pid, func() { stop(); stopRedis() }, nil
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
	return "", "", 0, nil, fmt.Errorf("unknown proxy %q (have direct, llmlb, llmlb-keyed, llmlb-redis, llmlb-capture, go, haproxy, nginx)", name)
}

// writeLLMLBConfig writes the config file of an llmlb row to dir and
// returns its path: llmlb in front of backend, its admin listener on admin
// ("" for none), and for llmlb-redis cluster.redis at redis. The
// llmlb-capture row is the llmlb row with a capture of every request
// ([capturePath]), keyed by a salt file beside it.
func writeLLMLBConfig(name, backend, admin, redis, dir string) (string, error) {
	// The saturation queue threshold is HAProxy's server maxconn in
	// startProxy: each proxy queues requests only past 4,096 at the
	// backend. With the default 16, llmlb's ledger counts every request it
	// sent and has no first byte for yet as queued, so 64 clients kept it
	// queueing in its admission queue: routing policy, not what proxying
	// costs.
	cfg := fmt.Sprintf("listen: 127.0.0.1:0\nadmin:\n  listen: %q\nlog:\n  level: warn\n  access: false\nbackends:\n  - url: %s\n", admin, backend)
	bal := "balancer:\n  saturation:\n    queue: 4096\n"
	if name == "llmlb-keyed" || name == "llmlb-redis" {
		// A key with limits no load reaches and a session per client:
		// what a fleet's replicas would ask Redis for on every request.
		cfg += fmt.Sprintf("auth:\n  keys:\n    - name: overhead\n      key: %s\n      requests_per_minute: 1000000000\n      tokens_per_minute: 1000000000\n", proxy.HashKey(overheadKey))
		bal += "  session:\n    header: " + overheadSession + "\n"
	}
	if name == "llmlb-redis" {
		cfg += "cluster:\n  redis:\n    address: " + redis + "\n"
	}
	if name == "llmlb-capture" {
		// Every request captured (issue 57: capture on costs at most 5%
		// of the requests per second at 64 clients). The salt is a file's,
		// as the config file may not hold one; a fixed salt, since the ids
		// of a benchmark's prompts are no secret.
		salt := filepath.Join(dir, "capture-salt")
		if err := os.WriteFile(salt, []byte("llmlb-overhead-capture-salt\n"), 0o600); err != nil {
			return "", err
		}
		cfg += fmt.Sprintf("capture:\n  path: %q\n  sample: 1\n  salt_file: %q\n", capturePath(dir), salt)
	}
	path := filepath.Join(dir, "llmlb.yaml")
	if err := os.WriteFile(path, []byte(cfg+bal), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// capturePath is the file the llmlb-capture row captures to in dir.
func capturePath(dir string) string { return filepath.Join(dir, "capture.jsonl") }

// captureLines counts the lines of the capture at path and of its rotated
// files (path.1, path.2, ...), and removes them, so that the next
// llmlb-capture row of the run counts its own. Run calls it once the
// row's process has stopped, which writes what it had queued.
func captureLines(path string) (int, error) {
	rotated, err := filepath.Glob(path + ".*")
	if err != nil {
		return 0, err
	}
	n := 0
	buf := make([]byte, 64<<10)
	for _, p := range append([]string{path}, rotated...) {
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		for {
			k, err := f.Read(buf)
			n += bytes.Count(buf[:k], []byte{'\n'})
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return 0, err
			}
		}
		f.Close()
		if err := os.Remove(p); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// The key and session header of the llmlb-keyed and llmlb-redis rows.
const (
	overheadKey     = "sk-llmlb-overhead-0123456789abcdef"
	overheadSession = "X-Session"
)

// rowRequest is what a row's requests carry beside the body: the key
// and the session header for llmlb-keyed and llmlb-redis, nothing for
// the others.
func rowRequest(name string) (h http.Header, session string) {
	if name != "llmlb-keyed" && name != "llmlb-redis" {
		return nil, ""
	}
	return http.Header{"Authorization": {"Bearer " + overheadKey}}, overheadSession
}

// startRedis runs a redis-server on a free loopback port, without
// persistence, for the llmlb-redis row, and waits until it answers.
func startRedis(ctx context.Context, dir string) (addr string, stop func(), err error) {
	bin, err := findBinary("redis-server")
	if err != nil {
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
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

// rowEnv is env without llmlb's own variables (LLMLB_*), which would
// override the config a row writes: LLMLB_CAPTURE_SALT beside the
// llmlb-capture row's salt file fails its config.
func rowEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "LLMLB_") })
}

// startProcess runs bin with args until stop, and waits until it answers a
// completion. With addr "" the address is read from the process's
// "serving on http://ADDR" line (llmlb picks its own port). It returns the
// URL, the version, the process id and the stop function.
func startProcess(ctx context.Context, bin string, args []string, addr, name string) (string, string, int, func(), error) {
	version := versionOf(bin, name)
	cmd := exec.Command(bin, args...)
	cmd.Env = rowEnv(os.Environ())
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
	h, session := rowRequest(name)
	for {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		for k, vs := range h {
			req.Header[k] = vs
		}
		if session != "" {
			req.Header.Set(session, "probe")
		}
		resp, err := http.DefaultClient.Do(req)
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
