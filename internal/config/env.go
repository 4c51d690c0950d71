package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Environ is the process environment as [os.Environ] gives it, KEY=value
// entries. The program reads its LLMLB_* variables from it and nowhere else,
// so tests pass their own, and it can list them to refuse a misspelt one.
type Environ []string

// Get returns the value of key, or "" when it is not set; the first entry
// wins, as for [os.Getenv].
func (e Environ) Get(key string) string {
	for _, kv := range e {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// otherEnv are the LLMLB_* variables that are not config keys: each is
// read by a command, so the environment that sets it must still load a
// config. The tests' own variables start LLMLBTEST_ and are not llmlb's.
var otherEnv = []string{
	"LLMLB_REQUIRE_PROXIES", // llmlb overhead: fail when HAProxy or nginx is missing
}

// envName is the environment variable that overrides key:
// LLMLB_PROXY_MAX_ATTEMPTS for proxy.max_attempts.
func envName(key string) string {
	return "LLMLB_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// unknownEnv reports each LLMLB_* variable in env that overrides no config
// key and is none of [otherEnv], with the nearest known name: a typo
// (LLMLB_PROXY_MAX_ATTEMPT) would otherwise leave the default in force
// without a word.
func unknownEnv(env Environ, leaves map[string]any) []error {
	known := make([]string, 0, len(leaves)+len(otherEnv))
	for key := range leaves {
		known = append(known, envName(key))
	}
	known = append(known, otherEnv...)
	sort.Strings(known)
	var names []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "LLMLB_") && !slices.Contains(known, name) && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	errs := make([]error, 0, len(names))
	removed := map[string]string{}
	for key, why := range removedKeys {
		removed[envName(key)] = key + ": " + why
	}
	for _, name := range names {
		if why, ok := removed[name]; ok {
			errs = append(errs, fmt.Errorf("environment: %s is no longer a setting (%s)", name, why))
			continue
		}
		msg := fmt.Sprintf("environment: unknown variable %s", name)
		if near := nearestName(name, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", near)
		}
		errs = append(errs, errors.New(msg))
	}
	return errs
}
