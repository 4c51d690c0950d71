package config

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
)

// Keys returns the path of every key config.yaml may set, in the order
// the Config type declares them: mapstructure tags joined by dots, with
// "[]" for each element of a list of sections (backends[].url) and
// "<name>" for each entry of a map of sections (engines.<name>.queued).
// Sections are not listed themselves; a list or map of plain values is a
// key (backends[].labels).
func Keys() []string {
	return appendKeys(nil, reflect.TypeFor[Config](), "")
}

func appendKeys(keys []string, t reflect.Type, prefix string) []string {
	for i := range t.NumField() {
		f := t.Field(i)
		key, ok := fieldKey(f, prefix)
		if !ok {
			continue
		}
		switch ft := f.Type; {
		case ft.Kind() == reflect.Struct:
			keys = appendKeys(keys, ft, key)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = appendKeys(keys, ft.Elem(), key+"[]")
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			keys = appendKeys(keys, ft.Elem(), key+".<name>")
		default:
			keys = append(keys, key)
		}
	}
	return keys
}

// fieldKey returns the dotted key of struct field f under prefix, or false
// for a field config does not set.
func fieldKey(f reflect.StructField, prefix string) (string, bool) {
	tag := f.Tag.Get("mapstructure")
	switch {
	case tag == "" || tag == "-":
		return "", false
	case prefix == "":
		return tag, true
	}
	return prefix + "." + tag, true
}

// flatten records every leaf of the struct v under its dotted mapstructure
// key. Slices and maps are leaves.
func flatten(v reflect.Value, prefix string, out map[string]any) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		key, ok := fieldKey(f, prefix)
		if !ok {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			flatten(v.Field(i), key, out)
			continue
		}
		out[key] = v.Field(i).Interface()
	}
}

// removedKeys are keys that were knobs and are no longer: the rule they
// tuned is fixed or gone. A config that sets one is told so, by name,
// rather than that the key is unknown.
var removedKeys = map[string]string{
	"balancer.ttft.base_latency":       "fixed at 20ms until learned",
	"balancer.ttft.kv_soft":            "fixed at 0.5",
	"balancer.ttft.kv_penalty":         "fixed at 1s",
	"balancer.ttft.tie_tolerance":      "fixed at 0.05",
	"balancer.ttft.cold_tie_tolerance": "see balancer.ttft.copy_margin",
	"balancer.ttft.cold_room":          "fixed at 0.5",
	"balancer.ttft.cold_backlog":       "fixed at 1",
	"balancer.ttft.miss_weight":        "fixed at 1",
	"balancer.ttft.decode_cost":        "fixed at 50µs",
	"balancer.saturation.keep_holders": "holders always stay candidates",
	"balancer.saturation.holder_queue": "fixed at 4",
}

// unknownKeys walks what the file holds against the struct type t and
// reports each key no field takes, with its full path and the nearest known
// key.
func unknownKeys(m map[string]any, t reflect.Type, path string) []error {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if tag := f.Tag.Get("mapstructure"); tag != "" && tag != "-" {
			fields[tag] = f.Type
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		full := k
		if path != "" {
			full = path + "." + k
		}
		ft, ok := fields[k]
		if why, gone := removedKeys[full]; !ok && gone {
			errs = append(errs, fmt.Errorf("%s: no longer a setting (%s; docs/routing.md#the-default-policy-ttft)", full, why))
			continue
		}
		if !ok {
			msg := fmt.Sprintf("unknown key %q", full)
			if near := nearest(k, fields); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			errs = append(errs, errors.New(msg))
			continue
		}
		switch {
		case ft.Kind() == reflect.Struct:
			if sub, ok := m[k].(map[string]any); ok {
				errs = append(errs, unknownKeys(sub, ft, full)...)
			}
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			if sub, ok := m[k].(map[string]any); ok {
				for _, name := range slices.Sorted(maps.Keys(sub)) {
					if entry, ok := sub[name].(map[string]any); ok {
						errs = append(errs, unknownKeys(entry, ft.Elem(), full+"."+name)...)
					}
				}
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			if list, ok := m[k].([]any); ok {
				for i, item := range list {
					if sub, ok := item.(map[string]any); ok {
						errs = append(errs, unknownKeys(lowerKeys(sub), ft.Elem(), fmt.Sprintf("%s[%d]", full, i))...)
					}
				}
			}
		}
	}
	return errs
}

// lowerKeys lower-cases map keys as viper does for nested maps but not for
// maps inside lists.
func lowerKeys(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}

// nearest returns the known key closest to k by edit distance, if close.
func nearest(k string, fields map[string]reflect.Type) string {
	return nearestName(k, slices.Sorted(maps.Keys(fields)))
}

// nearestName returns the name in sorted names closest to k by edit
// distance, if close.
func nearestName(k string, names []string) string {
	best, bestD := "", 3
	for _, f := range names {
		if d := editDistance(k, f); d < bestD {
			best, bestD = f, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
