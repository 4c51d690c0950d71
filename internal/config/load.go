package config

import (
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/llmlb/llmlb/balancer"
)

// Error lists every problem found in one config file.
type Error struct {
	File     string
	Problems []error
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s: %v", e.File, p)
	}
	return b.String()
}

// Load reads path with a private viper instance over the defaults,
// applies LLMLB_* overrides from env (LLMLB_PROXY_MAX_ATTEMPTS sets
// proxy.max_attempts), and decodes strictly: an unknown key, or an LLMLB_*
// variable that names no key, is an error naming it. It returns a
// [*Error] listing every problem: values of the wrong type do not
// hide the others, since they are left at their defaults while the rest is
// validated.
func Load(path string, env Environ) (Config, error) {
	cfg, problems, _ := load(path, env)
	if len(problems) > 0 {
		return Config{}, &Error{File: path, Problems: problems}
	}
	return cfg, nil
}

// load is [Load] returning its problems, and the config as decoded over
// the defaults even when there are some; read reports whether the file
// was read at all.
func load(path string, env Environ) (cfg Config, problems []error, read bool) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("no such file; name the config file with --config PATH (config.yaml in llmlb's repository runs against `llmlb sim --count 3`)")
		}
		return Config{}, []error{err}, false
	}
	problems = append(problems, unknownKeys(v.AllSettings(), reflect.TypeFor[Config](), "")...)

	def := DefaultConfig()
	leaves := map[string]any{}
	flatten(reflect.ValueOf(def), "", leaves)
	fromEnv := map[string]string{} // key -> variable that set it
	for key, val := range leaves {
		v.SetDefault(key, val)
		name := envName(key)
		if s := env.Get(name); s != "" {
			v.Set(key, s)
			fromEnv[key] = name
		}
	}
	problems = append(problems, unknownEnv(env, leaves)...)
	// Unknown keys were found above, with their paths and a suggestion;
	// decoding reports the values that do not fit their field. Decoding
	// over the defaults leaves such a field at its default, so Validate
	// below judges the rest of the file without tripping on it.
	cfg = def
	err := v.Unmarshal(&cfg, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationHook,
		commaListHook,
	)))
	problems = append(problems, decodeProblems(err, v.AllSettings(), fromEnv)...)
	for _, name := range decodeErrorKeys(err) {
		resetList(reflect.ValueOf(&cfg).Elem(), reflect.ValueOf(def), name)
	}
	if cfg.Cluster.Redis.Password != "" && fromEnv["cluster.redis.password"] == "" {
		// A secret in the file ends up in version control and backups.
		problems = append(problems, errors.New("cluster.redis.password: not in the config file; set LLMLB_CLUSTER_REDIS_PASSWORD or cluster.redis.password_file"))
		cfg.Cluster.Redis.Password = ""
	}
	if cfg.Capture.Salt != "" && fromEnv["capture.salt"] == "" {
		// A salt in the file is as good as none to whoever reads the file.
		problems = append(problems, errors.New("capture.salt: not in the config file; set LLMLB_CAPTURE_SALT or capture.salt_file"))
		cfg.Capture.Salt = ""
	}
	cfg.Balancer.MaxCandidates = cfg.Proxy.MaxAttempts
	if pr, err := balancer.LookupPreset(cfg.Balancer.Policy); err == nil {
		explicit := v.InConfig("scrape.interval") || env.Get("LLMLB_SCRAPE_INTERVAL") != ""
		cfg.Scrape.Interval = pr.ScrapeEvery(cfg.Scrape.Interval, explicit)
	}
	problems = append(problems, unjoin(cfg.Validate())...)
	return cfg, problems, true
}

// unjoin flattens an errors.Join tree into its leaves.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}
