package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// loadExampleConfig validates an llmlb config given as text, as `llmlb
// validate` would the file, and returns it.
func loadExampleConfig(t *testing.T, name, text string) Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path, noEnv)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return cfg
}

func readYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// dig walks maps and lists by key or index.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func port(t *testing.T, hostport string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// TestExampleConfigsValidate: every llmlb config anywhere under examples/,
// files and the Kubernetes ConfigMap alike, validates.
func TestExampleConfigsValidate(t *testing.T) {
	n := 0
	err := filepath.WalkDir("examples", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		if isLLMLBConfig(t, path) {
			b, _ := os.ReadFile(path)
			loadExampleConfig(t, path, string(b))
			n++
		}
		for _, doc := range readYAML(t, path) {
			if doc["kind"] == "ConfigMap" {
				if text, ok := dig(doc, "data", "config.yaml").(string); ok {
					loadExampleConfig(t, path+" ConfigMap", text)
					n++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Errorf("only %d example configs found", n)
	}
}

// TestComposeExample: the compose file parses; llmlb's published ports are
// the ones its mounted config listens on (admin on the host's loopback
// only); its backends are the vLLM services at the port they serve on; the
// vLLM services reserve a GPU each and health-check /health.
func TestComposeExample(t *testing.T) {
	docs := readYAML(t, "examples/docker-compose.yaml")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	services, _ := docs[0]["services"].(map[string]any)
	lb := services["llmlb"]
	var mount string
	for _, v := range dig(lb, "volumes").([]any) {
		if s := v.(string); strings.HasSuffix(s, ":/etc/llmlb/config.yaml:ro") {
			mount = strings.TrimSuffix(s, ":/etc/llmlb/config.yaml:ro")
		}
	}
	cmd := dig(lb, "command").([]any)
	if mount == "" || !slices.Equal(cmd, []any{"serve", "--config", "/etc/llmlb/config.yaml"}) {
		t.Fatalf("llmlb: config mount %q, command %v", mount, cmd)
	}
	b, err := os.ReadFile(filepath.Join("examples", mount))
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadExampleConfig(t, mount, string(b))
	ports := dig(lb, "ports").([]any)
	wantPorts := []any{strconv.Itoa(port(t, cfg.Listen)) + ":" + strconv.Itoa(port(t, cfg.Listen)),
		"127.0.0.1:" + strconv.Itoa(port(t, cfg.Admin.Listen)) + ":" + strconv.Itoa(port(t, cfg.Admin.Listen))}
	if !slices.Equal(ports, wantPorts) || !strings.HasPrefix(cfg.Listen, "0.0.0.0:") {
		t.Errorf("llmlb ports %v, want %v (listen %s)", ports, wantPorts, cfg.Listen)
	}
	if df := dig(lb, "build", "dockerfile"); df != "examples/Dockerfile" {
		t.Errorf("llmlb build: %v", df)
	}
	if len(cfg.Backends) < 2 {
		t.Fatalf("%d backends", len(cfg.Backends))
	}
	gpus := map[any]bool{}
	for _, be := range cfg.Backends {
		host, p, err := net.SplitHostPort(strings.TrimPrefix(be.URL, "http://"))
		if err != nil {
			t.Fatalf("backend %q: %v", be.URL, err)
		}
		svc, ok := services[host]
		if !ok {
			t.Errorf("backend %s: no compose service %q", be.URL, host)
			continue
		}
		if !slices.Contains(dig(svc, "command").([]any), any("--port="+p)) {
			t.Errorf("service %s does not serve on port %s: %v", host, p, dig(svc, "command"))
		}
		test := strings.Join(toStrings(dig(svc, "healthcheck", "test")), " ")
		if !strings.Contains(test, "http://localhost:"+p+"/health") {
			t.Errorf("service %s health check %q", host, test)
		}
		dev := dig(svc, "deploy", "resources", "reservations", "devices", 0)
		if dig(dev, "driver") != "nvidia" || !slices.Contains(dig(dev, "capabilities").([]any), any("gpu")) {
			t.Errorf("service %s reserves no GPU: %v", host, dev)
		}
		gpus[dig(dev, "device_ids", 0)] = true
	}
	if len(gpus) != len(cfg.Backends) {
		t.Errorf("vLLM services share GPUs: %v", gpus)
	}
	for _, name := range []string{"prometheus", "grafana"} {
		if !slices.Equal(dig(services[name], "profiles").([]any), []any{"monitoring"}) {
			t.Errorf("%s is not optional", name)
		}
	}
	prom, err := os.ReadFile("examples/compose/prometheus.yml")
	if err != nil || !strings.Contains(string(prom), `"llmlb:`+strconv.Itoa(port(t, cfg.Admin.Listen))+`"`) {
		t.Errorf("prometheus.yml does not scrape llmlb's admin port: %v", err)
	}
}

func toStrings(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestKubernetesExample: the manifests parse; llmlb's container ports and
// probes are the ones its ConfigMap config listens on, with /health and
// /ready; the config discovers the headless Service of vllm.yaml by its
// cluster DNS name at the port the vLLM pods serve on.
func TestKubernetesExample(t *testing.T) {
	byKind := map[string]map[string]any{}
	for _, f := range []string{"examples/kubernetes/llmlb.yaml", "examples/kubernetes/vllm.yaml"} {
		for _, d := range readYAML(t, f) {
			byKind[d["kind"].(string)+"/"+dig(d, "metadata", "name").(string)] = d
		}
	}
	cm, dep, vsvc, vdep := byKind["ConfigMap/llmlb"], byKind["Deployment/llmlb"], byKind["Service/vllm"], byKind["Deployment/vllm"]
	if cm == nil || dep == nil || vsvc == nil || vdep == nil || byKind["Service/llmlb"] == nil {
		t.Fatalf("manifests: %v", byKind)
	}
	cfg := loadExampleConfig(t, "ConfigMap llmlb", dig(cm, "data", "config.yaml").(string))
	c := dig(dep, "spec", "template", "spec", "containers", 0)
	named := map[string]int{}
	for _, p := range dig(c, "ports").([]any) {
		named[dig(p, "name").(string)] = dig(p, "containerPort").(int)
	}
	if named["http"] != port(t, cfg.Listen) || named["admin"] != port(t, cfg.Admin.Listen) || !strings.HasPrefix(cfg.Listen, "0.0.0.0:") {
		t.Errorf("container ports %v, config listens on %s and %s", named, cfg.Listen, cfg.Admin.Listen)
	}
	if p := dig(c, "livenessProbe", "httpGet"); dig(p, "path") != "/health" || dig(p, "port") != "http" {
		t.Errorf("liveness probe %v", p)
	}
	if p := dig(c, "readinessProbe", "httpGet"); dig(p, "path") != "/ready" || dig(p, "port") != "http" {
		t.Errorf("readiness probe %v", p)
	}
	if dig(dep, "spec", "template", "metadata", "annotations", "prometheus.io/port") != strconv.Itoa(port(t, cfg.Admin.Listen)) {
		t.Error("the scrape annotation does not name the admin port")
	}
	mount := dig(c, "volumeMounts", 0, "mountPath")
	if args := toStrings(dig(c, "args")); !slices.Equal(args, []string{"serve", "--config", mount.(string) + "/config.yaml"}) {
		t.Errorf("args %v with the ConfigMap at %v", args, mount)
	}
	if len(cfg.Backends) != 1 || cfg.Backends[0].DNS == "" {
		t.Fatalf("backends %+v: want one DNS entry", cfg.Backends)
	}
	if dig(vsvc, "spec", "clusterIP") != "None" {
		t.Error("the vLLM Service is not headless: DNS would give one virtual IP")
	}
	if want := "vllm.default.svc.cluster.local"; cfg.Backends[0].DNS != want {
		t.Errorf("discovers %q, want the headless Service %q", cfg.Backends[0].DNS, want)
	}
	svcPort := dig(vsvc, "spec", "ports", 0, "port").(int)
	vc := dig(vdep, "spec", "template", "spec", "containers", 0)
	if !slices.Equal(cfg.Backends[0].Ports, []int{svcPort}) || dig(vc, "ports", 0, "containerPort") != svcPort ||
		!slices.Contains(toStrings(dig(vc, "args")), "--port="+strconv.Itoa(svcPort)) {
		t.Errorf("ports: config %v, Service %d, container %v", cfg.Backends[0].Ports, svcPort, dig(vc, "ports"))
	}
	if dig(vc, "resources", "limits", "nvidia.com/gpu") == nil {
		t.Error("vLLM pods request no GPU")
	}
}

// TestDeploymentFiles: the Dockerfile builds this module's main package
// statically and runs it as a non-root user; the systemd unit serves a
// config and reloads with SIGHUP; every query of the Grafana dashboard
// names only metrics the README documents.
func TestDeploymentFiles(t *testing.T) {
	df, err := os.ReadFile("examples/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0 go build", "-o /out/llmlb .", "USER nonroot", `ENTRYPOINT ["/llmlb"]`, "FROM gcr.io/distroless/static"} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	unit, err := os.ReadFile("examples/llmlb.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=/usr/local/bin/llmlb serve --config /etc/llmlb/config.yaml", "ExecReload=/bin/kill -HUP $MAINPID", "DynamicUser=yes"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("unit lacks %q", want)
		}
	}
	documented := documentedMetrics(t)
	used := map[string]bool{}
	for _, q := range dashboardQueries(t) {
		for _, m := range regexp.MustCompile(`llmlb_[a-z_]+`).FindAllString(q[1], -1) {
			base := strings.TrimSuffix(m, "_bucket")
			if !slices.Contains(documented, base) {
				t.Errorf("panel %q queries %s, which README does not document", q[0], m)
			}
			used[base] = true
		}
	}
	if len(used) < 20 {
		t.Errorf("the dashboard graphs only %d metrics", len(used))
	}
}
