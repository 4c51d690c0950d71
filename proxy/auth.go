package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/balancer"
)

// AuthConfig is the `auth:` section of config.yaml: the API keys clients
// present. It is applied again on every config reload.
type AuthConfig struct {
	// Keys are the API keys that may use the client listener. With none,
	// no key is asked for and anyone who reaches the listener may use it.
	// (default none)
	Keys []KeyConfig `mapstructure:"keys"`
}

// KeyConfig is one API key: a tenant with its models, priority and
// limits. The key itself is never in the file, only its SHA-256.
type KeyConfig struct {
	// Name names the key in metrics, logs and the status page; unique,
	// 1 to 64 letters, digits, '.', '_' or '-'. Required.
	Name string `mapstructure:"name"`
	// Key is the SHA-256 of the key, "sha256:" and 64 hex digits, as
	// `llmlb hash-key` prints it. Required.
	Key string `mapstructure:"key"`
	// Models are the model names, as clients send them (aliases included),
	// this key may use; any other model gets the same 404 as a model that
	// does not exist, and GET /v1/models lists only these. Empty means
	// every model. (default all)
	Models []string `mapstructure:"models"`
	// Priority is the admission priority of this key's requests (higher
	// is served first; negative is refused at once when every backend is
	// saturated). Unset means the model's priority from models:, else 0.
	// (default unset)
	Priority *int `mapstructure:"priority"`
	// AllowPriorityHeader lets this key's clients set their priority with
	// balancer.admission.priority_header; otherwise the header is ignored.
	// (default false)
	AllowPriorityHeader bool `mapstructure:"allow_priority_header"`
	// RequestsPerMinute limits this key's requests to the model routes;
	// past it, 429 with Retry-After. 0 means no limit. (default 0)
	RequestsPerMinute int `mapstructure:"requests_per_minute"`
	// TokensPerMinute limits this key's tokens: the prompt's estimate
	// (bytes/4; the whole body's on routes other than completions and
	// chat) is taken when a request is admitted, and corrected to the
	// prompt and completion tokens the backend reports in usage when a
	// completion or chat answer ends. 0 means no limit. (default 0)
	TokensPerMinute int `mapstructure:"tokens_per_minute"`
	// SLOTTFT and SLOTPOT are the deadlines of this key's requests that
	// set none (x-slo-ttft-ms, x-slo-tpot-ms): to the first token, and
	// per later token; they go before the model's (models[].slo_ttft).
	// 0 is none, at most a day. (default 0)
	SLOTTFT time.Duration `mapstructure:"slo_ttft"`
	SLOTPOT time.Duration `mapstructure:"slo_tpot"`
}

// maxPerMinute bounds a limit, so that a unit's share of the minute is
// at least a nanosecond.
const maxPerMinute = 1_000_000_000

// hashPrefix starts every key hash in the config file.
const hashPrefix = "sha256:"

// maxKeyBytes bounds a presented key; a longer bearer token is refused
// without being hashed.
const maxKeyBytes = 1 << 10

// HashKey returns the form of key the config file holds:
// "sha256:" and the hex of its SHA-256.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// ParseKeyHash reads a hash as [HashKey] writes it. Its error never
// quotes s, which may be a key pasted where its hash belongs.
func ParseKeyHash(s string) ([32]byte, error) {
	var h [32]byte
	rest, ok := strings.CutPrefix(s, hashPrefix)
	if !ok || len(rest) != 64 {
		return h, errors.New("must be sha256: and 64 hex digits, as `llmlb hash-key` prints it (the value is not repeated here: it may be a key)")
	}
	if _, err := hex.Decode(h[:], []byte(rest)); err != nil {
		return h, errors.New("must be sha256: and 64 hex digits, as `llmlb hash-key` prints it (the value is not repeated here: it may be a key)")
	}
	return h, nil
}

// Validate reports every problem in c at once.
func (c AuthConfig) Validate() error {
	var errs []error
	names := map[string]bool{}
	hashes := map[[32]byte]bool{}
	for i, k := range c.Keys {
		at := fmt.Sprintf("auth.keys[%d]", i)
		switch {
		case !validKeyName(k.Name):
			errs = append(errs, fmt.Errorf("%s.name: must be 1 to 64 letters, digits, '.', '_' or '-', got %q", at, k.Name))
		case names[k.Name]:
			errs = append(errs, fmt.Errorf("%s.name: %q is used twice", at, k.Name))
		}
		names[k.Name] = true
		if h, err := ParseKeyHash(k.Key); err != nil {
			errs = append(errs, fmt.Errorf("%s.key: %w", at, err))
		} else if hashes[h] {
			errs = append(errs, fmt.Errorf("%s.key: the same key as an earlier entry", at))
		} else {
			hashes[h] = true
		}
		for _, m := range k.Models {
			if m == "" {
				errs = append(errs, fmt.Errorf("%s.models: empty model name", at))
			}
		}
		for _, l := range []struct {
			name string
			n    int
		}{{"requests_per_minute", k.RequestsPerMinute}, {"tokens_per_minute", k.TokensPerMinute}} {
			if l.n < 0 || l.n > maxPerMinute {
				errs = append(errs, fmt.Errorf("%s.%s: must be 0 (no limit) to %d, got %d", at, l.name, maxPerMinute, l.n))
			}
		}
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"slo_ttft", k.SLOTTFT}, {"slo_tpot", k.SLOTPOT}} {
			if d.v < 0 || d.v > balancer.MaxDeadline {
				errs = append(errs, fmt.Errorf("%s.%s: must be 0 (none) to 24h, got %s", at, d.name, d.v))
			}
		}
	}
	return errors.Join(errs...)
}

func validKeyName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// tenant is one configured key as the running proxy holds it. Its fields
// are immutable once it is published in a keyring; its limiter is shared
// with the tenant of the same name in every later keyring, so a reload
// keeps what the key has used.
type tenant struct {
	name                string
	hash                [32]byte
	models              []string // nil: every model
	priority            *int
	allowPriorityHeader bool
	deadlines           deadlines // the key's default deadlines; 0: none
	limiter             *limiter
}

// allows reports whether the tenant may use model.
func (t *tenant) allows(model string) bool {
	return t.models == nil || slices.Contains(t.models, model)
}

// keyring is the set of keys in force, replaced whole on reload.
type keyring struct {
	tenants []*tenant
}

// authMetrics count what each key does, labelled by the key's name: never
// by the key or its hash.
type authMetrics struct {
	requests *prometheus.CounterVec // key, status
	tokens   *prometheus.CounterVec // key, type (prompt, completion)
	refused  *prometheus.CounterVec // reason (missing, invalid)
}

func newAuthMetrics(reg prometheus.Registerer) *authMetrics {
	m := &authMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_key_requests_total",
			Help: "Requests to the model routes made with each API key, by key name and HTTP status (429: over the key's limits).",
		}, []string{"key", "status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_key_tokens_total",
			Help: "Tokens each API key used, by key name and type (prompt, completion), as the backends reported them in usage.",
		}, []string{"key", "type"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_auth_refused_total",
			Help: "Requests refused with 401, by reason: missing (no bearer key) or invalid (a key that is not configured, or a malformed Authorization header).",
		}, []string{"reason"}),
	}
	m.refused.WithLabelValues("missing")
	m.refused.WithLabelValues("invalid")
	reg.MustRegister(m.requests, m.tokens, m.refused)
	return m
}

// auth holds the keyring in force: every request reads it without
// locking; SetAuth replaces it whole.
type auth struct {
	mu   sync.Mutex              // serialises SetAuth
	ring atomic.Pointer[keyring] // nil: no keys configured
}

// SetAuth puts c's keys in force for the requests that arrive from now on;
// requests already admitted keep the key they were admitted with, and a
// key that stays (by name) keeps what it has used of its limits. It may be
// called while the handlers serve, as a config reload does.
func (s *Server) SetAuth(c AuthConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	s.auth.mu.Lock()
	defer s.auth.mu.Unlock()
	old := map[string]*limiter{}
	if kr := s.auth.ring.Load(); kr != nil {
		for _, t := range kr.tenants {
			old[t.name] = t.limiter
		}
	}
	kr := &keyring{}
	now := time.Now()
	for _, k := range c.Keys {
		h, _ := ParseKeyHash(k.Key) // validated
		l := old[k.Name]
		if l == nil {
			l = &limiter{}
		}
		l.setLimits(now, k.RequestsPerMinute, k.TokensPerMinute)
		t := &tenant{name: k.Name, hash: h, priority: k.Priority, allowPriorityHeader: k.AllowPriorityHeader, limiter: l,
			deadlines: deadlines{ttft: k.SLOTTFT, tpot: k.SLOTPOT}}
		if len(k.Models) > 0 {
			t.models = slices.Clone(k.Models)
		}
		kr.tenants = append(kr.tenants, t)
	}
	if len(kr.tenants) == 0 {
		kr = nil
	}
	s.auth.ring.Store(kr)
	return nil
}

// Why a request was refused with 401.
var (
	errKeyMissing = errors.New("no API key")
	errKeyInvalid = errors.New("invalid API key")
	// errModelNotAllowed is a model the key may not use; the client is
	// told it does not exist ([unknownModelError]).
	errModelNotAllowed = errors.New("not among the key's models")
)

// authenticate returns the tenant whose key r bears, nil with no keys
// configured, or errKeyMissing or errKeyInvalid. The key's hash is
// compared with every configured hash in constant time, so neither the
// time taken nor the order of the keys tells how close a guess came.
func (s *Server) authenticate(r *http.Request) (*tenant, error) {
	kr := s.auth.ring.Load()
	if kr == nil {
		return nil, nil
	}
	key, err := clientKey(r.Header)
	if err != nil {
		s.authMetrics.refused.WithLabelValues(reasonOf(err)).Inc()
		return nil, err
	}
	sum := sha256.Sum256([]byte(key))
	var found *tenant
	for _, t := range kr.tenants {
		if subtle.ConstantTimeCompare(sum[:], t.hash[:]) == 1 {
			found = t
		}
	}
	if found == nil {
		s.authMetrics.refused.WithLabelValues("invalid").Inc()
		return nil, errKeyInvalid
	}
	return found, nil
}

func reasonOf(err error) string {
	if errors.Is(err, errKeyMissing) {
		return "missing"
	}
	return "invalid"
}

// HeaderAPIKey is the header Anthropic's clients send their key in.
const HeaderAPIKey = "X-Api-Key"

// clientKey returns the request's API key: "Authorization: Bearer <key>"
// as the OpenAI SDKs send it, or "x-api-key: <key>" as Anthropic's do. A
// request bearing both must bear the same key in both, and one of each at
// most: two keys leave it unclear which one is the client's.
func clientKey(h http.Header) (string, error) {
	xs := h.Values(HeaderAPIKey)
	if len(xs) == 0 {
		return bearer(h)
	}
	x := strings.TrimSpace(xs[0])
	if len(xs) > 1 || x == "" || len(x) > maxKeyBytes || strings.ContainsAny(x, " \t") {
		return "", errKeyInvalid
	}
	if len(h.Values("Authorization")) > 0 {
		b, err := bearer(h)
		if err != nil || b != x {
			return "", errKeyInvalid
		}
	}
	return x, nil
}

// bearer returns the key of the request's one Authorization header,
// "Bearer <key>" as the OpenAI SDKs send it (the scheme without case, RFC
// 7235). A key in the query string is not looked at.
func bearer(h http.Header) (string, error) {
	vs := h.Values("Authorization")
	switch {
	case len(vs) == 0:
		return "", errKeyMissing
	case len(vs) > 1:
		return "", errKeyInvalid
	}
	scheme, key, ok := strings.Cut(strings.TrimSpace(vs[0]), " ")
	key = strings.TrimLeft(key, " ")
	switch {
	case !ok && strings.EqualFold(scheme, "Bearer"), ok && strings.EqualFold(scheme, "Bearer") && key == "":
		return "", errKeyMissing
	case !ok || !strings.EqualFold(scheme, "Bearer") || len(key) > maxKeyBytes || strings.ContainsAny(key, " \t"):
		return "", errKeyInvalid
	}
	return key, nil
}

// RequireToken returns next behind a bearer token whose hash is token
// ("sha256:<hex>", as [HashKey] writes it): a request without it gets 401
// in OpenAI's shape. It guards the admin listener.
func (s *Server) RequireToken(token string, next http.Handler) (http.Handler, error) {
	want, err := ParseKeyHash(token)
	if err != nil {
		return nil, fmt.Errorf("admin.token: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := bearer(r.Header)
		sum := sha256.Sum256([]byte(key))
		if err == nil && subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			err = errKeyInvalid
		}
		if err != nil {
			writeError(w, s.errorFor(r.Context(), err))
			return
		}
		next.ServeHTTP(w, r)
	}), nil
}
