// Package tracing sets up OpenTelemetry traces: the `tracing:` section,
// and the tracer provider that exports spans over OTLP/HTTP.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is the `tracing:` section.
type Config struct {
	// Endpoint is an OpenTelemetry collector's OTLP/HTTP base URL, for
	// example http://otel-collector:4318; spans are posted to its
	// /v1/traces. Empty makes no spans. (default empty)
	Endpoint string `mapstructure:"endpoint"`
	// SampleRatio is the share of traces begun here that are recorded; a
	// request whose client sent a trace context follows the client's
	// sampling decision. (default 1)
	SampleRatio float64 `mapstructure:"sample_ratio"`
	// Propagate passes W3C trace context (traceparent, tracestate) to the
	// servers: the client's as sent, or, with an endpoint, llmlb's
	// attempt span as the server's parent. false removes it. (default true)
	Propagate bool `mapstructure:"propagate"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{SampleRatio: 1, Propagate: true} }

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("tracing.endpoint: %q is not an http:// or https:// URL", c.Endpoint))
		}
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		errs = append(errs, fmt.Errorf("tracing.sample_ratio: must be 0 to 1, got %g", c.SampleRatio))
	}
	return errors.Join(errs...)
}

// Propagator is W3C trace context, the format vLLM and SGLang read
// (vLLM's --otlp-traces-endpoint continues a traceparent).
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Start returns the tracer provider for c, which batches spans to the
// endpoint, and its shutdown, which flushes them; with no endpoint, nil
// and a no-op.
func Start(c Config) (trace.TracerProvider, func(context.Context) error, error) {
	if c.Endpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(joinTraces(c.Endpoint)))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing.endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "llmlb"), attribute.String("service.version", version()))),
	)
	return tp, tp.Shutdown, nil
}

// joinTraces is the endpoint's /v1/traces URL, unless it names that
// path already.
func joinTraces(endpoint string) string {
	u, _ := url.Parse(endpoint)
	if strings.HasSuffix(u.Path, "/v1/traces") {
		return u.String()
	}
	return u.JoinPath("v1", "traces").String()
}

// version is the module version the binary was built as.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return info.Main.Version
	}
	return ""
}
