package doccheck

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// scaledObject is KEDA's ScaledObject as its API publishes it
// (kedacore/keda, apis/keda/v1alpha1/scaledobject_types.go at 01ee1d30
// and scaletriggers_types.go): every field of its spec, so that the
// strict manifest decoder refuses one KEDA does not have. Status is left
// out: a manifest does not set it.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ScaleTargetRef *struct {
			Name                   string `json:"name"`
			APIVersion             string `json:"apiVersion,omitempty"`
			Kind                   string `json:"kind,omitempty"`
			EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
		} `json:"scaleTargetRef"`
		PollingInterval       *int32         `json:"pollingInterval,omitempty"`
		InitialCooldownPeriod *int32         `json:"initialCooldownPeriod,omitempty"`
		CooldownPeriod        *int32         `json:"cooldownPeriod,omitempty"`
		IdleReplicaCount      *int32         `json:"idleReplicaCount,omitempty"`
		MinReplicaCount       *int32         `json:"minReplicaCount,omitempty"`
		MaxReplicaCount       *int32         `json:"maxReplicaCount,omitempty"`
		Advanced              map[string]any `json:"advanced,omitempty"`
		Triggers              []struct {
			Type              string            `json:"type"`
			Name              string            `json:"name,omitempty"`
			UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
				Kind string `json:"kind,omitempty"`
			} `json:"authenticationRef,omitempty"`
			MetricType autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
		} `json:"triggers"`
		Fallback *struct {
			FailureThreshold int32  `json:"failureThreshold"`
			Replicas         int32  `json:"replicas"`
			Behavior         string `json:"behavior,omitempty"`
		} `json:"fallback,omitempty"`
	} `json:"spec"`
}

func (s *scaledObject) DeepCopyObject() runtime.Object { c := *s; return &c }

// kedaGroupVersion is the API group and version of scaledObject.
var kedaGroupVersion = schema.GroupVersion{Group: "keda.sh", Version: "v1alpha1"}

// prometheusMetadata are the keys KEDA's Prometheus scaler reads from a
// trigger's metadata (prometheusMetadata, kedacore/keda
// pkg/scalers/prometheus_scaler.go at 0805d72e).
var prometheusMetadata = []string{"serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
	"customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner", "authModes"}

// TestKubernetesScalingExamples: hpa.yaml (autoscaling/v2) and keda.yaml
// (KEDA's ScaledObject) decode strictly; both scale the vLLM Deployment of
// vllm.yaml on llmlb_model_saturation, which docs/operations.md documents,
// for the model those pods serve, as a Value target below 1 (the metric
// saturates at 1); KEDA's trigger uses only keys its Prometheus scaler
// reads, and a query that returns one series.
func TestKubernetesScalingExamples(t *testing.T) {
	var vllm *appsv1.Deployment
	for _, obj := range readManifests(t, filepath.Join(root, "examples", "kubernetes/vllm.yaml")) {
		if d, ok := obj.(*appsv1.Deployment); ok {
			vllm = d
		}
	}
	if vllm == nil {
		t.Fatal("vllm.yaml has no Deployment")
	}
	model := ""
	for _, a := range vllm.Spec.Template.Spec.Containers[0].Args {
		if m, ok := strings.CutPrefix(a, "--served-model-name="); ok {
			model = m
		}
	}
	if !slices.Contains(DocumentedMetrics(t, filepath.Join(root, MetricsPage)), "llmlb_model_saturation") {
		t.Error("llmlb_model_saturation is not documented")
	}

	objs := readManifests(t, filepath.Join(root, "examples", "kubernetes/hpa.yaml"))
	hpa, ok := objs[0].(*autoscalingv2.HorizontalPodAutoscaler)
	if len(objs) != 1 || !ok {
		t.Fatalf("hpa.yaml: %d objects, want one HorizontalPodAutoscaler", len(objs))
	}
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != vllm.Name {
		t.Errorf("the HPA scales %s %s, want Deployment %s", ref.Kind, ref.Name, vllm.Name)
	}
	if len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].External == nil {
		t.Fatalf("the HPA's metrics %+v: want one External", hpa.Spec.Metrics)
	}
	ext := hpa.Spec.Metrics[0].External
	if ext.Metric.Name != "llmlb_model_saturation" || ext.Metric.Selector == nil || ext.Metric.Selector.MatchLabels["model"] != model {
		t.Errorf("the HPA reads %s %v, want llmlb_model_saturation for model %s", ext.Metric.Name, ext.Metric.Selector, model)
	}
	if ext.Target.Type != autoscalingv2.ValueMetricType || ext.Target.Value == nil || ext.Target.Value.AsApproximateFloat64() <= 0 || ext.Target.Value.AsApproximateFloat64() >= 1 {
		t.Errorf("the HPA's target %+v: want a Value between 0 and 1", ext.Target)
	}

	objs = readManifests(t, filepath.Join(root, "examples", "kubernetes/keda.yaml"))
	so, ok := objs[0].(*scaledObject)
	if len(objs) != 1 || !ok {
		t.Fatalf("keda.yaml: %d objects, want one ScaledObject", len(objs))
	}
	if ref := so.Spec.ScaleTargetRef; ref == nil || ref.Name != vllm.Name || ref.Kind != "" && ref.Kind != "Deployment" {
		t.Errorf("the ScaledObject scales %+v, want the Deployment %s", ref, vllm.Name)
	}
	if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "prometheus" {
		t.Fatalf("the ScaledObject's triggers %+v: want one prometheus", so.Spec.Triggers)
	}
	tr := so.Spec.Triggers[0]
	for k := range tr.Metadata {
		if !slices.Contains(prometheusMetadata, k) {
			t.Errorf("trigger metadata %q is no key of KEDA's Prometheus scaler", k)
		}
	}
	if q := tr.Metadata["query"]; !strings.HasPrefix(q, "max(") || !strings.Contains(q, `llmlb_model_saturation{model="`+model+`"}`) {
		t.Errorf("query %q: want the max of llmlb_model_saturation for model %s, one series", q, model)
	}
	if tr.MetricType != autoscalingv2.ValueMetricType || tr.Metadata["threshold"] == "" || tr.Metadata["serverAddress"] == "" {
		t.Errorf("trigger %+v: want a Value threshold and a server", tr)
	}
}
