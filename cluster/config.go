package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Config is the `cluster:` section of config.yaml: the state replicas of
// llmlb share.
type Config struct {
	// Redis is where the state lives; without an address, nowhere: the
	// process keeps its limits, sessions and ledger to itself.
	Redis RedisConfig `mapstructure:"redis"`
	// StatelessReplicas says other llmlb replicas route to the same
	// backends without Redis: new prompts and conversations are then
	// placed by a hash every replica computes alike, so that they agree
	// without talking. Without it and without Redis, llmlb takes itself
	// to be alone and places them by its own view of load and cache
	// (docs/routing.md#new-prompts). With Redis they are placed by the
	// hash too. (default false)
	StatelessReplicas bool `mapstructure:"stateless_replicas"`
	// ShareLoad publishes this replica's work in flight per backend every
	// PublishInterval and counts the other replicas' in every pick. Off by
	// default: the servers' scraped queues already carry most of it
	// (docs/benchmarks.md#with-a-shared-ledger). (default false)
	ShareLoad bool `mapstructure:"share_load"`
	// PublishInterval is how often the load is published and read; a
	// replica's load counts for five intervals after it was written (at
	// least 1s), so a replica that dies stops counting then.
	// (default 100ms)
	PublishInterval time.Duration `mapstructure:"publish_interval"`
	// SessionTTL is how long a session's home is kept after its last
	// request. (default 1h)
	SessionTTL time.Duration `mapstructure:"session_ttl"`
	// LimitsWhenDown is what the keys' limits do while Redis is down:
	// local enforces each limit in each replica alone, as without Redis
	// (N replicas admit up to N times a limit); refuse answers 503 to
	// every request of a limited key until Redis is back. (default local)
	LimitsWhenDown string `mapstructure:"limits_when_down"`
}

// RedisConfig is `cluster.redis:`, the server the fleet's state lives in.
type RedisConfig struct {
	// Address is host:port of the Redis or Valkey server. Empty: no
	// cluster state. (default empty)
	Address string `mapstructure:"address"`
	// Username is the ACL user, empty for the default user. (default empty)
	Username string `mapstructure:"username"`
	// Password is the user's password; it may come only from the
	// environment (LLMLB_CLUSTER_REDIS_PASSWORD), never from the config
	// file. (default empty)
	Password string `mapstructure:"password"`
	// PasswordFile holds the password (a trailing newline is dropped),
	// as a Docker or Kubernetes secret mounts it. (default empty)
	PasswordFile string `mapstructure:"password_file"`
	// DB is the database number. (default 0)
	DB int `mapstructure:"db"`
	// TLS connects with TLS, verified against the system roots or CAFile.
	// (default false)
	TLS bool `mapstructure:"tls"`
	// CAFile is a PEM bundle of the CAs that sign the server's
	// certificate, with TLS. (default empty: the system roots)
	CAFile string `mapstructure:"ca_file"`
	// ServerName is the name the server's certificate must carry, with
	// TLS. (default: the host of Address)
	ServerName string `mapstructure:"server_name"`
	// KeyPrefix starts every key llmlb writes, so that fleets (or other
	// programs) can share a server. (default "llmlb:")
	KeyPrefix string `mapstructure:"key_prefix"`
	// Timeout bounds every call, connecting included: a request waits at
	// most this long for Redis before it goes on without it. (default 50ms)
	Timeout time.Duration `mapstructure:"timeout"`
}

// Limits when Redis is down.
const (
	LimitsLocal  = "local"
	LimitsRefuse = "refuse"
)

// DefaultConfig returns the defaults: no cluster state.
func DefaultConfig() Config {
	return Config{
		ShareLoad:       false,
		PublishInterval: 100 * time.Millisecond,
		SessionTTL:      time.Hour,
		LimitsWhenDown:  LimitsLocal,
		Redis:           RedisConfig{KeyPrefix: "llmlb:", Timeout: 50 * time.Millisecond},
	}
}

// Enabled reports whether c names a Redis server.
func (c Config) Enabled() bool { return c.Redis.Address != "" }

// Replicated reports whether other replicas route beside this one, with
// Redis or without: what [balancer.TTFTConfig.Replicated] needs.
func (c Config) Replicated() bool { return c.StatelessReplicas || c.Enabled() }

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("cluster."+key+": "+format, args...))
	}
	r := c.Redis
	if r.Address != "" {
		if host, port, err := net.SplitHostPort(r.Address); err != nil || host == "" || port == "" {
			bad("redis.address", "want host:port, got %q", r.Address)
		}
	}
	if r.Password != "" && r.PasswordFile != "" {
		bad("redis.password_file", "set the password once: LLMLB_CLUSTER_REDIS_PASSWORD or password_file, not both")
	}
	if r.DB < 0 {
		bad("redis.db", "must be 0 or more, got %d", r.DB)
	}
	if !r.TLS && (r.CAFile != "" || r.ServerName != "") {
		bad("redis.tls", "ca_file and server_name need tls: true")
	}
	if r.KeyPrefix == "" || strings.ContainsAny(r.KeyPrefix, " \t\r\n") {
		bad("redis.key_prefix", "must be set, without spaces, got %q", r.KeyPrefix)
	}
	if r.Timeout <= 0 || r.Timeout > 10*time.Second {
		bad("redis.timeout", "must be above 0 and at most 10s, got %s", r.Timeout)
	}
	if c.PublishInterval < 10*time.Millisecond || c.PublishInterval > time.Minute {
		bad("publish_interval", "must be 10ms to 1m, got %s", c.PublishInterval)
	}
	if c.SessionTTL < time.Second {
		bad("session_ttl", "must be at least 1s, got %s", c.SessionTTL)
	}
	if c.LimitsWhenDown != LimitsLocal && c.LimitsWhenDown != LimitsRefuse {
		bad("limits_when_down", "must be local or refuse, got %q", c.LimitsWhenDown)
	}
	return errors.Join(errs...)
}

// Files is what the files cluster.redis names hold, read and parsed.
type Files struct {
	// Password is password_file's content, "" without one.
	Password string
	// TLS is the client's TLS config with tls on (ca_file's CAs, else
	// the system roots); nil with it off.
	TLS *tls.Config
}

// OpenFiles reads and parses the files c names; the error names each key
// whose file does not load. Serve opens them before it starts, and
// `llmlb validate` checks them.
func (c Config) OpenFiles() (Files, error) {
	var f Files
	var errs []error
	r := c.Redis
	if r.PasswordFile != "" {
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster.redis.password_file: %w", err))
		}
		f.Password = strings.TrimRight(string(b), "\r\n")
	}
	if r.TLS || r.CAFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.ServerName}
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(r.Address)
		}
		if r.CAFile != "" {
			pem, err := os.ReadFile(r.CAFile)
			pool := x509.NewCertPool()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("cluster.redis.ca_file: %w", err))
			case !pool.AppendCertsFromPEM(pem):
				errs = append(errs, fmt.Errorf("cluster.redis.ca_file: no PEM certificate in %s", r.CAFile))
			}
			tc.RootCAs = pool
		}
		f.TLS = tc
	}
	if err := errors.Join(errs...); err != nil {
		return Files{}, err
	}
	return f, nil
}

// loadTTL is how long a replica's published load counts.
func (c Config) loadTTL() time.Duration { return max(time.Second, 5*c.PublishInterval) }
