package tracing

import (
	"context"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{DefaultConfig(), true},
		{Config{Endpoint: "http://collector:4318", SampleRatio: 0.1}, true},
		{Config{Endpoint: "collector:4318", SampleRatio: 1}, false},
		{Config{Endpoint: "ftp://collector", SampleRatio: 1}, false},
		{Config{SampleRatio: 1.5}, false},
		{Config{SampleRatio: -0.1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
}

func TestJoinTraces(t *testing.T) {
	for in, want := range map[string]string{
		"http://c:4318":           "http://c:4318/v1/traces",
		"http://c:4318/":          "http://c:4318/v1/traces",
		"https://c/otlp":          "https://c/otlp/v1/traces",
		"http://c:4318/v1/traces": "http://c:4318/v1/traces",
	} {
		if got := joinTraces(in); got != want {
			t.Errorf("joinTraces(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStartWithoutEndpoint(t *testing.T) {
	tp, stop, err := Start(DefaultConfig())
	if tp != nil || err != nil || stop(context.Background()) != nil {
		t.Errorf("no endpoint: %v, %v", tp, err)
	}
}
