package doccheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/llmlb/llmlb/internal/config"
)

// isConfig tells llmlb configs from other YAML in examples/ (compose
// files, Kubernetes manifests): ours have a top-level backends key.
func isConfig(t *testing.T, path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return regexp.MustCompile(`(?m)^backends:`).Match(b)
}

// manifestDecoder decodes Kubernetes manifests into the k8s.io/api types of
// the apiVersion and kind they name, and KEDA's ScaledObject into
// [scaledObject], strictly: an unknown or misspelt field, a duplicate key,
// or a kind outside core/v1, apps/v1, autoscaling/v2 and KEDA's
// ScaledObject is an error.
var manifestDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(appsv1.AddToScheme(s))
	utilruntime.Must(autoscalingv2.AddToScheme(s))
	s.AddKnownTypeWithName(kedaGroupVersion.WithKind("ScaledObject"), &scaledObject{})
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// decodeManifests decodes every document of a multi-document manifest;
// documents that hold only comments are skipped.
func decodeManifests(b []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		j, err := sigsyaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
			continue
		}
		obj, _, err := manifestDecoder.Decode(j, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

// isManifest: every document of the YAML file names an apiVersion and a kind.
func isManifest(docs []map[string]any) bool {
	for _, d := range docs {
		if d["apiVersion"] == nil || d["kind"] == nil {
			return false
		}
	}
	return len(docs) > 0
}

func readManifests(t *testing.T, path string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

// port returns the port of a host:port.
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
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		if isConfig(t, path) {
			b, _ := os.ReadFile(path)
			LoadConfig(t, path, string(b))
			n++
		}
		if !isManifest(ReadYAML(t, path)) {
			return nil
		}
		for _, obj := range readManifests(t, path) {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				if text, ok := cm.Data["config.yaml"]; ok {
					LoadConfig(t, path+" ConfigMap "+cm.Name, text)
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

// composeLLMLB reads the compose file examples/file, of one document, and
// returns its services, its llmlb service and the config that service
// mounts and serves, which must load; llmlb must publish the ports that
// config listens on, the admin port on the host's loopback only.
func composeLLMLB(t *testing.T, file string) (services map[string]any, lb any, cfg config.Config) {
	t.Helper()
	docs := ReadYAML(t, filepath.Join(root, "examples", file))
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents", file, len(docs))
	}
	services, _ = docs[0]["services"].(map[string]any)
	lb = services["llmlb"]
	var mount string
	for _, v := range Dig(lb, "volumes").([]any) {
		if s := v.(string); strings.HasSuffix(s, ":/etc/llmlb/config.yaml:ro") {
			mount = strings.TrimSuffix(s, ":/etc/llmlb/config.yaml:ro")
		}
	}
	cmd := Dig(lb, "command").([]any)
	if mount == "" || !slices.Equal(cmd, []any{"serve", "--config", "/etc/llmlb/config.yaml"}) {
		t.Fatalf("%s: llmlb's config mount %q, command %v", file, mount, cmd)
	}
	b, err := os.ReadFile(filepath.Join(root, "examples", mount))
	if err != nil {
		t.Fatal(err)
	}
	cfg = LoadConfig(t, mount, string(b))
	ports := Dig(lb, "ports").([]any)
	wantPorts := []any{strconv.Itoa(port(t, cfg.Listen)) + ":" + strconv.Itoa(port(t, cfg.Listen)),
		"127.0.0.1:" + strconv.Itoa(port(t, cfg.Admin.Listen)) + ":" + strconv.Itoa(port(t, cfg.Admin.Listen))}
	if !slices.Equal(ports, wantPorts) {
		t.Errorf("%s: llmlb ports %v, want %v", file, ports, wantPorts)
	}
	return services, lb, cfg
}

// TestComposeExample: the compose file parses; llmlb's published ports are
// the ones its mounted config listens on (admin on the host's loopback
// only); its backends are the vLLM services at the port they serve on; the
// vLLM services reserve a GPU each and health-check /health.
func TestComposeExample(t *testing.T) {
	services, lb, cfg := composeLLMLB(t, "docker-compose.yaml")
	if !strings.HasPrefix(cfg.Listen, "0.0.0.0:") {
		t.Errorf("listen %s: the published port reaches no one", cfg.Listen)
	}
	if df := Dig(lb, "build", "dockerfile"); df != "examples/Dockerfile" {
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
		if !slices.Contains(Dig(svc, "command").([]any), any("--port="+p)) {
			t.Errorf("service %s does not serve on port %s: %v", host, p, Dig(svc, "command"))
		}
		test := strings.Join(toStrings(Dig(svc, "healthcheck", "test")), " ")
		if !strings.Contains(test, "http://localhost:"+p+"/health") {
			t.Errorf("service %s health check %q", host, test)
		}
		dev := Dig(svc, "deploy", "resources", "reservations", "devices", 0)
		if Dig(dev, "driver") != "nvidia" || !slices.Contains(Dig(dev, "capabilities").([]any), any("gpu")) {
			t.Errorf("service %s reserves no GPU: %v", host, dev)
		}
		gpus[Dig(dev, "device_ids", 0)] = true
	}
	if len(gpus) != len(cfg.Backends) {
		t.Errorf("vLLM services share GPUs: %v", gpus)
	}
	for _, name := range []string{"prometheus", "grafana"} {
		if !slices.Equal(Dig(services[name], "profiles").([]any), []any{"monitoring"}) {
			t.Errorf("%s is not optional", name)
		}
	}
	prom, err := os.ReadFile(filepath.Join(root, "examples", "compose/prometheus.yml"))
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

// TestKubernetesExample: the manifests decode strictly into the k8s.io/api
// types; llmlb's container ports and probes are the ones its ConfigMap
// config listens on, with /health and /ready; its config volume is that
// ConfigMap and its Service selects its pods; the config discovers the
// headless Service of vllm.yaml by its cluster DNS name at the port the vLLM
// pods serve on.
func TestKubernetesExample(t *testing.T) {
	cms := map[string]*corev1.ConfigMap{}
	deps := map[string]*appsv1.Deployment{}
	svcs := map[string]*corev1.Service{}
	for _, f := range []string{filepath.Join(root, "examples", "kubernetes/llmlb.yaml"), filepath.Join(root, "examples", "kubernetes/vllm.yaml")} {
		for _, obj := range readManifests(t, f) {
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				cms[o.Name] = o
			case *appsv1.Deployment:
				deps[o.Name] = o
			case *corev1.Service:
				svcs[o.Name] = o
			default:
				t.Errorf("%s: unexpected %T", f, obj)
			}
		}
	}
	cm, dep, lsvc, vsvc, vdep := cms["llmlb"], deps["llmlb"], svcs["llmlb"], svcs["vllm"], deps["vllm"]
	if cm == nil || dep == nil || lsvc == nil || vsvc == nil || vdep == nil {
		t.Fatalf("manifests: ConfigMaps %v, Deployments %v, Services %v", slices.Collect(maps.Keys(cms)), slices.Collect(maps.Keys(deps)), slices.Collect(maps.Keys(svcs)))
	}
	text, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("ConfigMap llmlb has no config.yaml")
	}
	cfg := LoadConfig(t, "ConfigMap llmlb", text)
	pod := dep.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("llmlb pod: %d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = int(p.ContainerPort)
	}
	if named["http"] != port(t, cfg.Listen) || named["admin"] != port(t, cfg.Admin.Listen) || !strings.HasPrefix(cfg.Listen, "0.0.0.0:") {
		t.Errorf("container ports %v, config listens on %s and %s", named, cfg.Listen, cfg.Admin.Listen)
	}
	for _, pr := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"liveness", "/health", c.LivenessProbe}, {"readiness", "/ready", c.ReadinessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil || pr.probe.HTTPGet.Path != pr.path || pr.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v, want GET %s on port http", pr.name, pr.probe, pr.path)
		}
	}
	if pod.Annotations["prometheus.io/port"] != strconv.Itoa(port(t, cfg.Admin.Listen)) {
		t.Error("the scrape annotation does not name the admin port")
	}
	if len(c.VolumeMounts) == 0 {
		t.Fatal("llmlb mounts no volume")
	}
	mount := c.VolumeMounts[0]
	if !slices.Equal(c.Args, []string{"serve", "--config", mount.MountPath + "/config.yaml"}) {
		t.Errorf("args %v with the ConfigMap at %v", c.Args, mount.MountPath)
	}
	vi := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if vi < 0 || pod.Spec.Volumes[vi].ConfigMap == nil || pod.Spec.Volumes[vi].ConfigMap.Name != cm.Name {
		t.Errorf("volume %q is not ConfigMap %q: %+v", mount.Name, cm.Name, pod.Spec.Volumes)
	}
	for _, d := range []*appsv1.Deployment{dep, vdep} {
		for k, v := range d.Spec.Selector.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("Deployment %s selects %s=%s, which its pods lack", d.Name, k, v)
			}
		}
	}
	for _, s := range []struct {
		svc *corev1.Service
		dep *appsv1.Deployment
	}{{lsvc, dep}, {vsvc, vdep}} {
		for k, v := range s.svc.Spec.Selector {
			if s.dep.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the pods of %s lack", s.svc.Name, k, v, s.dep.Name)
			}
		}
		for _, p := range s.svc.Spec.Ports {
			if !slices.ContainsFunc(s.dep.Spec.Template.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.String() }) {
				t.Errorf("Service %s targets port %s, which %s does not name", s.svc.Name, p.TargetPort.String(), s.dep.Name)
			}
		}
	}
	if len(cfg.Backends) != 1 || cfg.Backends[0].DNS == "" {
		t.Fatalf("backends %+v: want one DNS entry", cfg.Backends)
	}
	if vsvc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Error("the vLLM Service is not headless: DNS would give one virtual IP")
	}
	if want := "vllm.default.svc.cluster.local"; cfg.Backends[0].DNS != want {
		t.Errorf("discovers %q, want the headless Service %q", cfg.Backends[0].DNS, want)
	}
	if len(vsvc.Spec.Ports) == 0 || len(vdep.Spec.Template.Spec.Containers) == 0 || len(vdep.Spec.Template.Spec.Containers[0].Ports) == 0 {
		t.Fatal("the vLLM Service or container names no port")
	}
	svcPort := int(vsvc.Spec.Ports[0].Port)
	vc := vdep.Spec.Template.Spec.Containers[0]
	if !slices.Equal(cfg.Backends[0].Ports, []int{svcPort}) || int(vc.Ports[0].ContainerPort) != svcPort ||
		!slices.Contains(vc.Args, "--port="+strconv.Itoa(svcPort)) {
		t.Errorf("ports: config %v, Service %d, container %v", cfg.Backends[0].Ports, svcPort, vc.Ports)
	}
	if _, ok := vc.Resources.Limits["nvidia.com/gpu"]; !ok {
		t.Error("vLLM pods request no GPU")
	}
}

// TestKubernetesManifestStrict: the manifest decoder refuses a misspelt or
// unknown field, a duplicate key and an unknown kind, where reading the YAML
// by hand let them through; the same manifest spelt right decodes.
func TestKubernetesManifestStrict(t *testing.T) {
	const good = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: x
spec:
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: x
          image: x
`
	objs, err := decodeManifests([]byte("# a comment only\n---\n" + good))
	if err != nil || len(objs) != 1 {
		t.Fatalf("the correct manifest: %d objects, %v", len(objs), err)
	}
	if d, ok := objs[0].(*appsv1.Deployment); !ok || len(d.Spec.Template.Spec.Containers) != 1 || d.Spec.Template.Spec.Containers[0].Image != "x" {
		t.Fatalf("decoded %#v", objs[0])
	}
	for name, bad := range map[string]string{
		"misspelt containers": strings.Replace(good, "containers:", "contianers:", 1),
		"misspelt metadata":   strings.Replace(good, "metadata:\n  name", "metdata:\n  name", 1),
		"unknown field":       strings.Replace(good, "image: x", "image: x\n          imagePolicy: Always", 1),
		"duplicate key":       strings.Replace(good, "image: x", "image: x\n          image: y", 1),
		"unknown kind":        strings.Replace(good, "kind: Deployment", "kind: Deploymnet", 1),
		"second document":     good + "---\n" + strings.Replace(good, "containers:", "contianers:", 1),
	} {
		if bad == good {
			t.Fatalf("%s: the replacement did not apply", name)
		}
		if _, err := decodeManifests([]byte(bad)); err == nil {
			t.Errorf("%s: decoded without error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestDeploymentFiles: the Dockerfile builds this module's main package
// statically and runs it as a non-root user; the systemd unit serves a
// config and reloads with SIGHUP; every query of the Grafana dashboard
// names only metrics docs/operations.md documents.
func TestDeploymentFiles(t *testing.T) {
	df, err := os.ReadFile(filepath.Join(root, "examples", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0 go build", "-o /out/llmlb .", "USER nonroot", `ENTRYPOINT ["/llmlb"]`, "FROM gcr.io/distroless/static"} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	unit, err := os.ReadFile(filepath.Join(root, "examples", "llmlb.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=/usr/local/bin/llmlb serve --config /etc/llmlb/config.yaml", "ExecReload=/bin/kill -HUP $MAINPID", "DynamicUser=yes"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("unit lacks %q", want)
		}
	}
	documented := DocumentedMetrics(t, filepath.Join(root, MetricsPage))
	used := map[string]bool{}
	for _, q := range DashboardQueries(t, filepath.Join(root, "examples", "grafana-dashboard.json")) {
		for _, m := range regexp.MustCompile(`llmlb_[a-z_]+`).FindAllString(q[1], -1) {
			base := strings.TrimSuffix(m, "_bucket")
			if !slices.Contains(documented, base) {
				t.Errorf("panel %q queries %s, which %s does not document", q[0], m, MetricsPage)
			}
			used[base] = true
		}
	}
	if len(used) < 20 {
		t.Errorf("the dashboard graphs only %d metrics", len(used))
	}
}

// TestComposeDataParallelExample: the data-parallel compose file parses;
// llmlb's published ports are the ones its mounted config listens on; its
// one backend is the vLLM service at the port it serves on, whose
// --data-parallel-size is the number of GPUs it reserves and the config's
// data_parallel_size; the ranks' KV events are followed at the endpoint
// the server publishes on, its replay ports clear of the event ports.
func TestComposeDataParallelExample(t *testing.T) {
	services, _, cfg := composeLLMLB(t, "compose-data-parallel.yaml")
	if len(cfg.Backends) != 1 {
		t.Fatalf("%d backends, want the one data-parallel server", len(cfg.Backends))
	}
	be := cfg.Backends[0]
	host, p, err := net.SplitHostPort(strings.TrimPrefix(be.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	svc, ok := services[host]
	if !ok {
		t.Fatalf("backend %s: no compose service %q", be.URL, host)
	}
	cmd := toStrings(Dig(svc, "command"))
	if !slices.Contains(cmd, "--port="+p) {
		t.Errorf("service %s does not serve on port %s: %v", host, p, cmd)
	}
	size := 0
	var kvConfig string
	for _, a := range cmd {
		if v, ok := strings.CutPrefix(a, "--data-parallel-size="); ok {
			size, _ = strconv.Atoi(v)
		}
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			kvConfig = v
		}
	}
	gpus := Dig(svc, "deploy", "resources", "reservations", "devices", 0, "device_ids").([]any)
	if size < 2 || len(gpus) != size || be.DataParallelSize != size {
		t.Errorf("--data-parallel-size=%d, %d GPUs reserved, data_parallel_size %d: want one rank per GPU, alike", size, len(gpus), be.DataParallelSize)
	}
	var kv struct {
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
	}
	if err := json.Unmarshal([]byte(kvConfig), &kv); err != nil {
		t.Fatalf("--kv-events-config: %v", err)
	}
	portOf := func(ep string) int {
		n, _ := strconv.Atoi(ep[strings.LastIndexByte(ep, ':')+1:])
		return n
	}
	if portOf(be.KVEvents) != portOf(kv.Endpoint) || portOf(be.KVEventsReplay) != portOf(kv.Replay) {
		t.Errorf("kv_events %s and %s, server publishes at %s and %s", be.KVEvents, be.KVEventsReplay, kv.Endpoint, kv.Replay)
	}
	if e, r := portOf(kv.Endpoint), portOf(kv.Replay); r < e+size && e < r+size {
		t.Errorf("ranks' event ports %d+ and replay ports %d+ overlap over %d ranks", e, r, size)
	}
}

// TestKubernetesRedisExample: llmlb's ConfigMap names the Service of
// redis.yaml by its cluster DNS name at its port; llmlb's container and
// Redis's take the password from the same Secret key, Redis through
// --requirepass, llmlb through LLMLB_CLUSTER_REDIS_PASSWORD; the Service
// selects the Redis pods at the port they serve.
func TestKubernetesRedisExample(t *testing.T) {
	var cm *corev1.ConfigMap
	var lb, rd *appsv1.Deployment
	var svc *corev1.Service
	for _, f := range []string{"kubernetes/llmlb.yaml", "kubernetes/redis.yaml"} {
		for _, obj := range readManifests(t, filepath.Join(root, "examples", f)) {
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				cm = o
			case *appsv1.Deployment:
				if o.Name == "redis" {
					rd = o
				} else {
					lb = o
				}
			case *corev1.Service:
				if o.Name == "redis" {
					svc = o
				}
			}
		}
	}
	if cm == nil || lb == nil || rd == nil || svc == nil {
		t.Fatal("llmlb.yaml and redis.yaml: a ConfigMap, two Deployments and the redis Service")
	}
	cfg := LoadConfig(t, "ConfigMap llmlb", cm.Data["config.yaml"])
	if want := "redis.default.svc.cluster.local:" + strconv.Itoa(int(svc.Spec.Ports[0].Port)); cfg.Cluster.Redis.Address != want {
		t.Errorf("cluster.redis.address %q, want the redis Service %q", cfg.Cluster.Redis.Address, want)
	}
	secretOf := func(c corev1.Container, env string) string {
		for _, e := range c.Env {
			if e.Name == env && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			}
		}
		return ""
	}
	rc := rd.Spec.Template.Spec.Containers[0]
	lbSecret, rdSecret := secretOf(lb.Spec.Template.Spec.Containers[0], "LLMLB_CLUSTER_REDIS_PASSWORD"), secretOf(rc, "REDIS_PASSWORD")
	if lbSecret == "" || lbSecret != rdSecret {
		t.Errorf("password: llmlb from %q, Redis from %q; want one Secret key", lbSecret, rdSecret)
	}
	if i := slices.Index(rc.Args, "--requirepass"); i < 0 || i+1 >= len(rc.Args) || rc.Args[i+1] != "$(REDIS_PASSWORD)" {
		t.Errorf("redis args %v: want --requirepass $(REDIS_PASSWORD)", rc.Args)
	}
	for k, v := range svc.Spec.Selector {
		if rd.Spec.Template.Labels[k] != v {
			t.Errorf("Service redis selects %s=%s, which the Redis pods lack", k, v)
		}
	}
	if len(rc.Ports) == 0 || rc.Ports[0].Name != svc.Spec.Ports[0].TargetPort.String() || rc.Ports[0].ContainerPort != 6379 {
		t.Errorf("Redis container ports %v, Service targets %s", rc.Ports, svc.Spec.Ports[0].TargetPort.String())
	}
}

// TestComposeReplicasExample: both llmlb services of compose-replicas.yaml
// serve the one mounted config, publish its ports (the second on other
// host ports) and take the Redis password from the variable Redis's
// --requirepass takes; the config names the redis service at the port
// Redis serves on by default.
func TestComposeReplicasExample(t *testing.T) {
	services, lb, cfg := composeLLMLB(t, "compose-replicas.yaml")
	second := services["llmlb-2"]
	if !reflect.DeepEqual(Dig(lb, "volumes"), Dig(second, "volumes")) || !reflect.DeepEqual(Dig(lb, "command"), Dig(second, "command")) {
		t.Errorf("llmlb-2 does not serve llmlb's config: %v %v", Dig(second, "volumes"), Dig(second, "command"))
	}
	listen, admin := strconv.Itoa(port(t, cfg.Listen)), strconv.Itoa(port(t, cfg.Admin.Listen))
	for _, p := range toStrings(Dig(second, "ports")) {
		if !strings.HasSuffix(p, ":"+listen) && !strings.HasSuffix(p, ":"+admin) {
			t.Errorf("llmlb-2 publishes %s, not a port its config listens on", p)
		}
	}
	host, p, err := net.SplitHostPort(cfg.Cluster.Redis.Address)
	if err != nil || services[host] == nil || p != "6379" {
		t.Fatalf("cluster.redis.address %q: want a compose service at Redis's port", cfg.Cluster.Redis.Address)
	}
	for _, name := range []string{"llmlb", "llmlb-2"} {
		if v := Dig(services[name], "environment", "LLMLB_CLUSTER_REDIS_PASSWORD"); v != "${REDIS_PASSWORD:?set REDIS_PASSWORD}" {
			t.Errorf("%s's password: %v", name, v)
		}
	}
	cmd := toStrings(Dig(services[host], "command"))
	if i := slices.Index(cmd, "--requirepass"); i < 0 || i+1 >= len(cmd) || cmd[i+1] != "${REDIS_PASSWORD:?set REDIS_PASSWORD}" {
		t.Errorf("redis command %v: want --requirepass from REDIS_PASSWORD", cmd)
	}
}
