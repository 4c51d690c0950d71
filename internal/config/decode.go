package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
)

// durationHook reads a duration from a string such as "5s", and refuses a
// bare number other than 0, which would be nanoseconds: `interval: 5` is
// meant as seconds or milliseconds, never 5ns.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[time.Duration]() || from == to {
		return data, nil
	}
	switch from.Kind() {
	case reflect.String:
		return time.ParseDuration(strings.TrimSpace(data.(string)))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		if reflect.ValueOf(data).IsZero() {
			return time.Duration(0), nil
		}
		return nil, errors.New("a number without a unit")
	}
	return data, nil
}

// commaListHook lets a string fill a list field as comma-separated items, so
// LLMLB_PROXY_RETRY_STATUSES=502,503 works; the items are then converted to
// the element type.
func commaListHook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return data, nil
	}
	s := strings.TrimSpace(data.(string))
	if s == "" {
		return []string{}, nil
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts, nil
}

// decodeProblems splits a decoding error into one problem per field, each
// named by its key path and repeating the value that does not fit, with an
// example of one that does. settings is what viper decoded (the file over
// the defaults, with the environment's overrides); fromEnv maps each key an
// LLMLB_* variable set to that variable's name.
func decodeProblems(err error, settings map[string]any, fromEnv map[string]string) []error {
	if err == nil {
		return nil
	}
	leaves := decodeLeaves(err)
	out := make([]error, 0, len(leaves))
	for _, l := range leaves {
		var de *mapstructure.DecodeError
		if !errors.As(l, &de) {
			out = append(out, l)
			continue
		}
		name := de.Name()
		val, found := lookupSetting(settings, name)
		ft, typed := fieldType(reflect.TypeFor[Config](), name)
		if !found || !typed {
			out = append(out, fmt.Errorf("%s: %w", name, de.Unwrap()))
			continue
		}
		where := ""
		if env, ok := fromEnv[name]; ok {
			where = " (from " + env + ")"
		}
		out = append(out, fmt.Errorf("%s: %s%s %s", name, showValue(val), where, expected(ft)))
	}
	return out
}

// decodeLeaves returns the errors viper's decoding joined, one a field,
// from under the message it wraps them in.
func decodeLeaves(err error) []error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		return unjoin(joined.(error))
	}
	return []error{err}
}

// decodeErrorKeys returns the key path of each field decoding failed on.
func decodeErrorKeys(err error) []string {
	if err == nil {
		return nil
	}
	var names []string
	for _, l := range decodeLeaves(err) {
		var de *mapstructure.DecodeError
		if errors.As(l, &de) {
			names = append(names, de.Name())
		}
	}
	return names
}

// resetList undoes what a failed decode of one list item (name ends in
// "[i]") left in cfg: the list holds a zero item in its place, which
// Validate would report as a second, made-up problem. The whole list goes
// back to its default in def, or to empty where def has none (inside a
// backend).
func resetList(cfg, def reflect.Value, name string) {
	parts := strings.Split(name, ".")
	last, _, indexed := strings.Cut(parts[len(parts)-1], "[")
	if !indexed {
		return // the field kept its default
	}
	for i, part := range parts {
		field, idx, indexed := strings.Cut(part, "[")
		if i == len(parts)-1 {
			field, indexed = last, false
		}
		cfg, def = structField(cfg, field), structField(def, field)
		if !cfg.IsValid() {
			return
		}
		if indexed {
			n, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
			if cfg.Kind() != reflect.Slice || err != nil || n >= cfg.Len() {
				return
			}
			cfg = cfg.Index(n)
			if def.IsValid() && def.Kind() == reflect.Slice && n < def.Len() {
				def = def.Index(n)
			} else {
				def = reflect.Value{}
			}
		}
	}
	if !cfg.CanSet() || (cfg.Kind() != reflect.Slice && cfg.Kind() != reflect.Map) {
		return
	}
	if def.IsValid() {
		cfg.Set(def)
	} else {
		cfg.SetZero()
	}
}

// structField returns the field of struct v tagged name, or the zero Value.
func structField(v reflect.Value, name string) reflect.Value {
	if !v.IsValid() || v.Kind() != reflect.Struct {
		return reflect.Value{}
	}
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("mapstructure") == strings.ToLower(name) {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

// expected says what a field of type t takes, with an example.
func expected(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "is not a duration; write it with a unit, like 500ms, 5s or 10m"
	case t.Kind() == reflect.Bool:
		return "is not true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "is not a whole number; write it like 3"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "is not a number; write it like 0.5"
	case t.Kind() == reflect.String:
		return `is not a single value; write it like "text"`
	case t.Kind() == reflect.Slice:
		return "is not a list; write it like [a, b]"
	case t.Kind() == reflect.Map || t.Kind() == reflect.Struct:
		return "is not a section of keys; write it as key: value lines indented below"
	}
	return "does not fit a " + t.String()
}

// showValue prints a config value as the user wrote it, quoting strings.
func showValue(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// lookupSetting finds the value at a decoder key path such as
// "scrape.interval" or "backends[0].url" in viper's settings.
func lookupSetting(settings map[string]any, name string) (any, bool) {
	var cur any = settings
	for _, part := range strings.Split(name, ".") {
		field, idx, indexed := strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[field]; !ok {
			if cur, ok = lowerKeys(m)[strings.ToLower(field)]; !ok {
				return nil, false
			}
		}
		if !indexed {
			continue
		}
		idx = strings.TrimSuffix(idx, "]")
		switch c := cur.(type) {
		case []any:
			i, err := strconv.Atoi(idx)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		case map[string]any:
			if cur, ok = c[idx]; !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return cur, true
}

// fieldType follows a decoder key path through t's mapstructure tags to the
// type of the field it names.
func fieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for _, part := range strings.Split(name, ".") {
		field, _, indexed := strings.Cut(part, "[")
		if t.Kind() != reflect.Struct {
			return nil, false
		}
		found := false
		for i := range t.NumField() {
			if f := t.Field(i); f.Tag.Get("mapstructure") == strings.ToLower(field) {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return nil, false
		}
		if indexed {
			if t.Kind() != reflect.Slice && t.Kind() != reflect.Map {
				return nil, false
			}
			t = t.Elem()
		}
	}
	return t, true
}
