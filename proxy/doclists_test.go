package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// httpAPIDoc returns docs/http-api.md.
func httpAPIDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of doc from the heading from to the next
// heading at its level or above.
func section(t *testing.T, doc, from string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+from+"\n")
	if i < 0 {
		t.Fatalf("no heading %q", from)
	}
	rest := doc[i+len(from)+2:]
	level := strings.Repeat("#", strings.Count(strings.Fields(from)[0], "#"))
	if j := regexp.MustCompile(`(?m)^#{1,` + strconv.Itoa(len(level)) + `} `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

// TestRouteTableIsDocumented: every route of the client listener is in
// docs/http-api.md's table, and every route the table names is served.
func TestRouteTableIsDocumented(t *testing.T) {
	doc := section(t, httpAPIDoc(t), "## Client listener")
	table := doc[:strings.Index(doc, "### ")]
	served := map[string]bool{}
	for _, rt := range clientRoutes() {
		served[rt.method+" "+rt.path] = true
		if !strings.Contains(table, "`"+rt.method+" "+rt.path+"`") && !strings.Contains(table, "`"+rt.path+"`") {
			t.Errorf("route %s %s is not in docs/http-api.md's client listener table", rt.method, rt.path)
		}
	}
	for _, m := range regexp.MustCompile("`((?:GET|POST|DELETE|PUT) /[^`]*)`").FindAllStringSubmatch(table, -1) {
		if !served[m[1]] {
			t.Errorf("docs/http-api.md names %s, which the client listener does not serve", m[1])
		}
	}
}

// TestReasonsAreDocumented: every balancer.Reason (read from
// balancer/reason.go, their one owner) is in docs/http-api.md's
// x-llmlb-reason list, and the list names no other.
func TestReasonsAreDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../balancer/reason.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Values) == 1 {
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "Reason" {
				if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
					r, _ := strconv.Unquote(lit.Value)
					reasons = append(reasons, r)
				}
			}
		}
		return true
	})
	if len(reasons) < 10 {
		t.Fatalf("read %d reasons from balancer/reason.go: %v", len(reasons), reasons)
	}
	doc := httpAPIDoc(t)
	i := strings.Index(doc, "- `x-llmlb-reason`:")
	item := doc[i : i+strings.Index(doc[i:], "\n- ")]
	for _, r := range reasons {
		if !strings.Contains(item, "`"+r+"`") {
			t.Errorf("reason %q is not in docs/http-api.md's x-llmlb-reason list", r)
		}
	}
	for _, m := range regexp.MustCompile("`([a-z-]+)`").FindAllStringSubmatch(item, -1) {
		if m[1] != "x-llmlb-reason" && !slices.Contains(reasons, m[1]) && !strings.Contains(m[1], "sglang") {
			t.Errorf("docs/http-api.md's reason list names %q, which is no balancer.Reason", m[1])
		}
	}
}

// TestDebugBackendsFieldsAreDocumented: /debug/backends' fields are
// BackendStatus' JSON names, each in docs/http-api.md's row for it.
func TestDebugBackendsFieldsAreDocumented(t *testing.T) {
	doc := httpAPIDoc(t)
	i := strings.Index(doc, "| `GET /debug/backends` |")
	if i < 0 {
		t.Fatal("no /debug/backends row")
	}
	row := doc[i : i+strings.IndexByte(doc[i:], '\n')]
	typ := reflect.TypeFor[BackendStatus]()
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if !strings.Contains(row, "`"+name+"`") {
			t.Errorf("/debug/backends field %q is not in docs/http-api.md's row", name)
		}
	}
}
