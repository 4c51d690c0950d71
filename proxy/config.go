package proxy

import (
	"errors"
	"fmt"
	"time"
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
	}
}

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("proxy.max_body_bytes: must be positive, got %d", c.MaxBodyBytes))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 8 {
		errs = append(errs, fmt.Errorf("proxy.max_attempts: must be 1..8, got %d", c.MaxAttempts))
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
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("proxy.request_timeout: must not be negative, got %s", c.RequestTimeout))
	}
	if c.MaxIdleConnsPerBackend < 0 {
		errs = append(errs, fmt.Errorf("proxy.max_idle_conns_per_backend: must not be negative, got %d", c.MaxIdleConnsPerBackend))
	}
	return errors.Join(errs...)
}
