package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// Config is the `proxy:` section of config.yaml.
type Config struct {
	// MaxBodyBytes bounds a request body; a larger one gets 413. 128k tokens
	// of JSON-escaped text or token ids stay well under it. (default 16 MiB)
	MaxBodyBytes int64 `mapstructure:"max_body_bytes"`
	// MaxAttempts is how many backends one request may be tried on before
	// its first byte reaches the client, the first included. (default 3)
	MaxAttempts int `mapstructure:"max_attempts"`
	// RetryStatuses are backend statuses that send the request to the next
	// candidate instead of the client. Connect failures are always retried.
	// (default [502, 503])
	RetryStatuses []int `mapstructure:"retry_statuses"`
	// RetryBrokenConnections sends a request to the next candidate when the
	// backend's connection breaks before its response headers (the server
	// died or restarted mid-request; nothing reached the client). Turn it
	// off if a request that crashes a server must not be tried on another.
	// (default true)
	RetryBrokenConnections bool `mapstructure:"retry_broken_connections"`
	// DialTimeout bounds connecting to a backend. (default 5s)
	DialTimeout time.Duration `mapstructure:"dial_timeout"`
	// ResponseHeaderTimeout bounds the wait for a backend's response headers
	// after the request is sent; a long prompt's prefill happens in it for
	// non-streaming requests. 0 means no limit. (default 10m)
	ResponseHeaderTimeout time.Duration `mapstructure:"response_header_timeout"`
	// RequestTimeout bounds a whole request, streams included; past it the
	// client gets 504, or a cut stream if bytes were already sent. 0 means no
	// limit. (default 30m)
	RequestTimeout time.Duration `mapstructure:"request_timeout"`
	// RequestUsage asks backends for the final usage chunk of every stream
	// (stream_options.include_usage), so token metrics and the access log
	// cover streams too; when the client did not ask for it, the chunk is
	// taken out of the client's stream. (default true)
	RequestUsage bool `mapstructure:"request_usage"`
	// MaxIdleConnsPerBackend is the pool of idle keep-alive connections kept
	// per backend. (default 256)
	MaxIdleConnsPerBackend int `mapstructure:"max_idle_conns_per_backend"`

	// StreamFirstByteTimeout bounds the wait for a backend's response
	// headers on a streaming request. vLLM, SGLang and trtllm-serve send a
	// stream's headers as soon as they accept it, so a stream without
	// headers after a few seconds is a hung server: the request goes to
	// the next candidate, as after a connect failure, and with none left
	// the client gets 504. The smaller of this and ResponseHeaderTimeout
	// applies. 0 means ResponseHeaderTimeout alone. (default 15s)
	StreamFirstByteTimeout time.Duration `mapstructure:"stream_first_byte_timeout"`
	// TokenizeTimeout bounds the POST /tokenize a backend is asked before
	// the pick when the backends publish KV-cache events
	// (scrape.kv_events): a request whose tokens do not come in time is
	// matched by the prompt-text index alone. (default 200ms)
	TokenizeTimeout time.Duration `mapstructure:"tokenize_timeout"`
	// StreamIdleTimeout bounds the time a streaming response may send
	// nothing once its headers arrived, the wait for the first event
	// included: a backend silent for longer has stalled, and the client's
	// stream is cut (nothing is retried after the first byte). Time the
	// client takes to read does not count. 0 means no limit. (default 60s)
	StreamIdleTimeout time.Duration `mapstructure:"stream_idle_timeout"`
	// StreamContinuations is how many times a chat or completion stream
	// whose server breaks it after its first byte (the connection cut, a
	// stall past StreamIdleTimeout, an error event) may be continued on
	// another candidate, which is asked for the rest of the answer; 0
	// turns continuing off, and such a stream ends broken. (default 2)
	StreamContinuations int `mapstructure:"stream_continuations"`

	// ReadHeaderTimeout bounds reading a client request's headers; a
	// client slower than that is disconnected without an answer. (default
	// 10s)
	ReadHeaderTimeout time.Duration `mapstructure:"read_header_timeout"`
	// BodyReadTimeout bounds reading a client request's body, from the end
	// of its headers: a client that announces a body and does not send it
	// in time gets 408 and its connection is closed. (default 30s)
	BodyReadTimeout time.Duration `mapstructure:"body_read_timeout"`
	// IdleTimeout closes a client's keep-alive connection after this long
	// without a request. (default 2m)
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// MaxHeaderBytes bounds a request's line and headers together; past
	// it the client gets 431 in OpenAI's JSON shape. Go's HTTP server
	// refuses headers past twice this (plus 4 KiB) itself, with a
	// plain-text 431. (default 32 KiB)
	MaxHeaderBytes int `mapstructure:"max_header_bytes"`
	// MaxHeaderCount bounds the number of header fields a request may
	// carry, Host aside; past it the client gets 431. (default 100)
	MaxHeaderCount int `mapstructure:"max_header_count"`
	// MaxReadingConnections bounds the client connections the proxy waits
	// on: those still sending a request (headers, or a body not all in)
	// and keep-alive connections idle between requests. Past it, the one
	// silent the longest is closed (see [Shedder]); connections with a
	// request in flight do not count and are never closed. 0 means a
	// quarter of the process's file descriptor limit at start, at most
	// 16384. (default 0)
	MaxReadingConnections int `mapstructure:"max_reading_connections"`

	// ExtraRoutes are further POST paths forwarded like the inference
	// routes (balanced by the body's model), for example
	// /v1/load_lora_adapter on a trusted network. Paths are exact, no
	// wildcards. Engine administration routes are refused with 404 unless
	// listed here. (default none)
	ExtraRoutes []string `mapstructure:"extra_routes"`
	// BackendHeaders sends x-llmlb-backend (the answering backend's name:
	// its configured name, or b1, b2, ...; never its address) and
	// x-llmlb-reason (why the balancer chose it) on every proxied
	// response; false sends neither. (default true)
	BackendHeaders bool `mapstructure:"backend_headers"`

	// BackendCAFile is a PEM bundle of the CAs that sign HTTPS backends'
	// certificates (and their metrics pages'); it replaces the system
	// roots for them. Empty means the system roots. (default empty)
	BackendCAFile string `mapstructure:"backend_ca_file"`
	// BackendCertFile and BackendKeyFile are a PEM client certificate and
	// its key presented to HTTPS backends that ask for one (mutual TLS).
	// Set both or neither. (default empty)
	BackendCertFile string `mapstructure:"backend_cert_file"`
	BackendKeyFile  string `mapstructure:"backend_key_file"`
}

// InferenceRoutes are the POST paths forwarded by default besides
// /v1/completions and /v1/chat/completions, each balanced by the body's
// model: vLLM's and SGLang's inference and tokenizer routes. Routes that
// change a server (LoRA loading, cache resets, sleep, profiling) are not
// among them; see [Config.ExtraRoutes].
func InferenceRoutes() []string {
	return []string{
		"/v1/embeddings",
		"/v1/rerank",
		"/v2/rerank",
		"/rerank",
		"/v1/score",
		"/score",
		"/classify",
		"/pooling",
		"/tokenize",
		"/detokenize",
	}
}

// builtinRoutes are the paths the client listener serves itself or
// forwards by default ([clientRoutes]), which extra_routes may not name
// again.
func builtinRoutes() []string {
	var ps []string
	for _, rt := range clientRoutes() {
		if !slices.Contains(ps, rt.path) {
			ps = append(ps, rt.path)
		}
	}
	return ps
}

// DefaultConfig returns the proxy defaults.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:           16 << 20,
		MaxAttempts:            3,
		RetryStatuses:          []int{502, 503},
		RetryBrokenConnections: true,
		DialTimeout:            5 * time.Second,
		ResponseHeaderTimeout:  10 * time.Minute,
		RequestTimeout:         30 * time.Minute,
		MaxIdleConnsPerBackend: 256,
		RequestUsage:           true,
		StreamFirstByteTimeout: 15 * time.Second,
		TokenizeTimeout:        200 * time.Millisecond,
		StreamIdleTimeout:      60 * time.Second,
		StreamContinuations:    2,
		ReadHeaderTimeout:      10 * time.Second,
		BodyReadTimeout:        30 * time.Second,
		IdleTimeout:            2 * time.Minute,
		MaxHeaderBytes:         32 << 10,
		MaxHeaderCount:         100,
		BackendHeaders:         true,
	}
}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("proxy.max_body_bytes: must be positive, got %d", c.MaxBodyBytes))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > balancer.CandidateLimit {
		errs = append(errs, fmt.Errorf("proxy.max_attempts: must be 1..%d, got %d", balancer.CandidateLimit, c.MaxAttempts))
	}
	for _, s := range c.RetryStatuses {
		if s < 400 || s > 599 {
			errs = append(errs, fmt.Errorf("proxy.retry_statuses: %d is not a 4xx or 5xx status", s))
		}
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("proxy.dial_timeout: must be positive, got %s", c.DialTimeout))
	}
	if c.ResponseHeaderTimeout < 0 {
		errs = append(errs, fmt.Errorf("proxy.response_header_timeout: must not be negative, got %s", c.ResponseHeaderTimeout))
	}
	if c.TokenizeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("proxy.tokenize_timeout: must be positive, got %s", c.TokenizeTimeout))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("proxy.request_timeout: must not be negative, got %s", c.RequestTimeout))
	}
	if c.StreamContinuations < 0 {
		errs = append(errs, fmt.Errorf("proxy.stream_continuations: must not be negative, got %d", c.StreamContinuations))
	}
	if c.MaxIdleConnsPerBackend < 0 {
		errs = append(errs, fmt.Errorf("proxy.max_idle_conns_per_backend: must not be negative, got %d", c.MaxIdleConnsPerBackend))
	}
	type named struct {
		name string
		d    time.Duration
	}
	for _, t := range []named{{"stream_first_byte_timeout", c.StreamFirstByteTimeout}, {"stream_idle_timeout", c.StreamIdleTimeout}} {
		if t.d < 0 {
			errs = append(errs, fmt.Errorf("proxy.%s: must not be negative, got %s", t.name, t.d))
		}
	}
	for _, t := range []named{{"read_header_timeout", c.ReadHeaderTimeout}, {"body_read_timeout", c.BodyReadTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if t.d <= 0 {
			errs = append(errs, fmt.Errorf("proxy.%s: must be positive, got %s", t.name, t.d))
		}
	}
	if c.MaxHeaderBytes < 1<<10 || c.MaxHeaderBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("proxy.max_header_bytes: must be 1024..1048576, got %d", c.MaxHeaderBytes))
	}
	if c.MaxHeaderCount < 8 || c.MaxHeaderCount > 10000 {
		errs = append(errs, fmt.Errorf("proxy.max_header_count: must be 8..10000, got %d", c.MaxHeaderCount))
	}
	if c.MaxReadingConnections < 0 {
		errs = append(errs, fmt.Errorf("proxy.max_reading_connections: must not be negative, got %d", c.MaxReadingConnections))
	}
	if (c.BackendCertFile == "") != (c.BackendKeyFile == "") {
		errs = append(errs, errors.New("proxy.backend_cert_file: goes with proxy.backend_key_file: set both or neither"))
	}
	builtin := builtinRoutes()
	for i, p := range c.ExtraRoutes {
		switch {
		case !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "{}*?#%\\ \t") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.."):
			errs = append(errs, fmt.Errorf("proxy.extra_routes: %q must be an exact path starting with /, without wildcards, escapes or dot segments", p))
		case slices.Contains(builtin, p):
			errs = append(errs, fmt.Errorf("proxy.extra_routes: %q is already served", p))
		case slices.Contains(c.ExtraRoutes[:i], p):
			errs = append(errs, fmt.Errorf("proxy.extra_routes: %q is listed twice", p))
		}
	}
	return errors.Join(errs...)
}
