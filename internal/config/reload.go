package config

import "reflect"

// Section is a part of the config that a reload treats as a whole: a
// top-level key (proxy, backends), or a field of a section classified
// field by field (log.level).
type Section struct {
	// Key is the section's path, as in [Keys].
	Key string
	// Apply reports whether a reload applies a change to it at once;
	// false means it takes effect at the next start.
	Apply bool

	index []int // of its field in Config
}

// Sections returns every section of Config in declaration order, classed
// by its `reload` tag, the one list of what a reload applies. A field
// without the tag is classed field by field if it is a section, and
// otherwise as needing a restart; TestEveryKeyHasAReloadClass keeps every
// field tagged.
func Sections() []Section {
	return appendSections(nil, reflect.TypeFor[Config](), "", nil)
}

func appendSections(out []Section, t reflect.Type, prefix string, index []int) []Section {
	for i := range t.NumField() {
		f := t.Field(i)
		key, ok := fieldKey(f, prefix)
		if !ok {
			continue
		}
		idx := append(index[:len(index):len(index)], i)
		class, tagged := f.Tag.Lookup("reload")
		if !tagged && f.Type.Kind() == reflect.Struct {
			out = appendSections(out, f.Type, key, idx)
			continue
		}
		out = append(out, Section{Key: key, Apply: class == "apply", index: idx})
	}
	return out
}

// Changes compares the config that runs with one a reload loaded and
// returns the keys of the sections that differ, in declaration order:
// applied, those a reload applies; restart, those that take effect only
// at the next start. Only what config.yaml can set is compared, not what
// Load derives from it (balancer.max_candidates follows
// proxy.max_attempts and is no change of the balancer section).
func Changes(running, next Config) (applied, restart []string) {
	a, b := reflect.ValueOf(running), reflect.ValueOf(next)
	for _, s := range Sections() {
		if sameSettings(a.FieldByIndex(s.index), b.FieldByIndex(s.index)) {
			continue
		}
		if s.Apply {
			applied = append(applied, s.Key)
		} else {
			restart = append(restart, s.Key)
		}
	}
	return applied, restart
}

// InForce returns the config that runs once a reload of next has been
// applied to running: next's sections that a reload applies, running's
// others. A later reload is compared with it, so reverting a restart-only
// setting to the value in force is no change.
func InForce(running, next Config) Config {
	out := running
	o, n := reflect.ValueOf(&out).Elem(), reflect.ValueOf(next)
	for _, s := range Sections() {
		if s.Apply {
			o.FieldByIndex(s.index).Set(n.FieldByIndex(s.index))
		}
	}
	return out
}

// sameSettings reports whether a and b set the same values: structs
// field by field over the fields config sets, anything else as a whole.
func sameSettings(a, b reflect.Value) bool {
	if a.Kind() != reflect.Struct {
		return reflect.DeepEqual(a.Interface(), b.Interface())
	}
	for i := range a.NumField() {
		if _, ok := fieldKey(a.Type().Field(i), ""); !ok {
			continue
		}
		if !sameSettings(a.Field(i), b.Field(i)) {
			return false
		}
	}
	return true
}
