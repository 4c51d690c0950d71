package scrape

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Spec selects series on a /metrics page: a whole metric name and label
// matchers, written `name{label=value,...}`. Values may be quoted, with Go
// escapes (\" \\ \n), or bare. A series matches when its metric name is
// exactly Name and it carries every listed label with exactly that value;
// other labels are ignored.
type Spec struct {
	Name   string
	Labels []LabelMatch // sorted by name, names unique
}

// LabelMatch is one `label=value` of a [Spec].
type LabelMatch struct {
	Name, Value string
}

// Alternatives are specs tried in order: the first whose metric is on the
// page is read. Written `a | b`, as in the vLLM row, which reads the older
// vllm:gpu_cache_usage_perc only when vllm:kv_cache_usage_perc is absent.
// Empty means the signal is disabled.
type Alternatives []Spec

// String writes s back in spec syntax, labels sorted and values quoted.
func (s Spec) String() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	var b strings.Builder
	b.WriteString(s.Name)
	b.WriteByte('{')
	for i, l := range s.Labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.Name)
		b.WriteString(`="`)
		b.WriteString(quoteReplacer.Replace(l.Value))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// quoteReplacer escapes a label value as the Prometheus text format does,
// and as [unquote] reads it back: only \\, \" and \n. (Go's %q would write
// escapes like \x and \t that a spec does not have; the fuzzer found that.)
var quoteReplacer = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// String writes a back in spec syntax.
func (a Alternatives) String() string {
	parts := make([]string, len(a))
	for i, s := range a {
		parts[i] = s.String()
	}
	return strings.Join(parts, " | ")
}

// matches reports whether m carries every label s asks for.
func (s Spec) matches(m *dto.Metric) bool {
	for _, want := range s.Labels {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == want.Name {
				found = lp.GetValue() == want.Value
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ParseAlternatives parses `spec | spec | ...`. The empty string (or only
// blanks) gives no alternatives: the signal is disabled.
func ParseAlternatives(s string) (Alternatives, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out Alternatives
	for {
		spec, rest, err := parseSpec(s)
		if err != nil {
			return nil, err
		}
		out = append(out, spec)
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return out, nil
		}
		if rest[0] != '|' {
			return nil, fmt.Errorf("spec %q: unexpected %q after %s (separate alternatives with |)", s, rest, spec.Name)
		}
		s = rest[1:]
	}
}

var errEmptySpec = errors.New("empty spec")

// parseSpec reads one spec from the front of s and returns what follows it.
func parseSpec(s string) (Spec, string, error) {
	orig := s
	fail := func(format string, args ...any) (Spec, string, error) {
		return Spec{}, "", fmt.Errorf("spec %q: %s", strings.TrimSpace(orig), fmt.Sprintf(format, args...))
	}
	s = strings.TrimLeft(s, " \t")
	n := nameLen(s)
	if n == 0 {
		if s == "" || s[0] == '|' {
			return Spec{}, "", fmt.Errorf("spec %q: %w", strings.TrimSpace(orig), errEmptySpec)
		}
		return fail("a metric name must start with a letter, _ or :, found %q", s[:1])
	}
	spec := Spec{Name: s[:n]}
	s = strings.TrimLeft(s[n:], " \t")
	if s == "" || s[0] != '{' {
		return spec, s, nil
	}
	s = s[1:]
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return fail("missing }")
		}
		if s[0] == '}' {
			s = s[1:]
			break
		}
		ln := labelLen(s)
		if ln == 0 {
			return fail("expected a label name at %q", s)
		}
		label := s[:ln]
		s = strings.TrimLeft(s[ln:], " \t")
		if s == "" || s[0] != '=' {
			return fail("label %s: expected =", label)
		}
		s = strings.TrimLeft(s[1:], " \t")
		var value string
		if s != "" && s[0] == '"' {
			v, rest, err := unquote(s)
			if err != nil {
				return fail("label %s: %v", label, err)
			}
			value, s = v, rest
		} else {
			end := strings.IndexAny(s, ",} \t")
			if end < 0 {
				return fail("missing }")
			}
			value, s = s[:end], s[end:]
			if value == "" {
				return fail("label %s: empty value (write %s=\"\" to match an empty label)", label, label)
			}
		}
		if slices.ContainsFunc(spec.Labels, func(l LabelMatch) bool { return l.Name == label }) {
			return fail("label %s given twice", label)
		}
		spec.Labels = append(spec.Labels, LabelMatch{Name: label, Value: value})
		s = strings.TrimLeft(s, " \t")
		if s != "" && s[0] == ',' {
			s = s[1:]
		} else if s == "" || s[0] != '}' {
			return fail("expected , or } after label %s", label)
		}
	}
	slices.SortFunc(spec.Labels, func(a, b LabelMatch) int { return strings.Compare(a.Name, b.Name) })
	return spec, s, nil
}

// nameLen is the length of the metric name at the front of s: the
// Prometheus legacy charset [a-zA-Z_:][a-zA-Z0-9_:]*.
func nameLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9') {
			continue
		}
		return i
	}
	return len(s)
}

// labelLen is the length of the label name at the front of s:
// [a-zA-Z_][a-zA-Z0-9_]*.
func labelLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9') {
			continue
		}
		return i
	}
	return len(s)
}

// unquote reads a double-quoted value with \" \\ and \n escapes from the
// front of s.
func unquote(s string) (string, string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 >= len(s) {
				return "", "", errors.New("unterminated quoted value")
			}
			i++
			switch s[i] {
			case '"', '\\':
				b.WriteByte(s[i])
			case 'n':
				b.WriteByte('\n')
			default:
				return "", "", fmt.Errorf("unknown escape \\%c", s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("unterminated quoted value")
}
