package doccheck

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/config"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// README.md and the manual in docs/ are held to what can break for a
// user who follows them: the configs they show load, their links lead
// somewhere, the metrics table is the metrics the code registers, and
// the README stays a front page. That the commands they show exist is
// e2e's TestREADMECommandsExist, which builds and runs llmlb.

// readme reads README.md.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestREADMEIsAFrontPage: README.md stays at most 300 lines; the manual
// is in docs/.
func TestREADMEIsAFrontPage(t *testing.T) {
	if n := strings.Count(readme(t), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, want at most 300: move the detail to docs/", n)
	}
}

// TestREADMEQuickStartConfigLoads: the README's quick-start config (its
// first yaml block) loads as llmlb validate and serve load it, and lists
// at least two servers.
func TestREADMEQuickStartConfigLoads(t *testing.T) {
	blocks := Fenced(readme(t), "yaml")
	if len(blocks) == 0 {
		t.Fatal("README.md has no yaml block: the quick start's config is gone")
	}
	cfg := LoadConfig(t, "README.md's quick-start config", blocks[0])
	if len(cfg.Backends) < 2 {
		t.Errorf("README's quick-start config lists %d backends, want at least 2", len(cfg.Backends))
	}
}

// TestDocsConfigsLoad: every yaml block in README.md and docs/ that is a
// whole config (it has backends:) loads.
func TestDocsConfigsLoad(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	n := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range Fenced(string(b), "yaml") {
			if !regexp.MustCompile(`(?m)^backends:`).MatchString(block) {
				continue // a fragment, such as an engines: row
			}
			n++
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(block), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := config.Load(path, config.Environ{}); err != nil {
				t.Errorf("%s: yaml block %d does not load:\n%v", page, i+1, err)
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d whole configs in README.md and docs/, want the quick start's and getting-started's", n)
	}
}

// slug is the anchor GitHub makes of a heading.
func slug(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^\p{L}\p{N}_ -]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// TestREADMELinksResolve: every relative link in README.md leads to a
// file or directory of the repository, and every #anchor into a page to
// one of its headings.
func TestREADMELinksResolve(t *testing.T) {
	md := stripFenced(readme(t))
	n := 0
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(md, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		if path == "" {
			path = "README.md"
		}
		n++
		file := filepath.Join(root, path)
		b, err := os.ReadFile(file)
		if err != nil {
			if _, serr := os.Stat(file); serr == nil && anchor == "" {
				continue // a directory
			}
			t.Errorf("README links to %s: %v", target, err)
			continue
		}
		if anchor == "" {
			continue
		}
		var anchors []string
		for _, h := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(stripFenced(string(b)), -1) {
			anchors = append(anchors, slug(h[1]))
		}
		if !slices.Contains(anchors, anchor) {
			t.Errorf("README links to %s, but %s has no heading #%s", target, path, anchor)
		}
	}
	if n < 10 {
		t.Errorf("README has %d relative links, want the docs index at least", n)
	}
}

// stripFenced returns md without its fenced code blocks.
func stripFenced(md string) string {
	for _, block := range Fenced(md, "") {
		md = strings.Replace(md, block, "", 1)
	}
	return md
}

// wholeMetricName is an llmlb metric's whole name.
var wholeMetricName = regexp.MustCompile(`^llmlb_[a-z_]*[a-z]$`)

// registeredMetrics returns the metric names the module's code defines:
// every string literal that is a whole llmlb_ name, and the names a
// helper builds as "llmlb_" + its argument + a suffix, one per call with a
// literal argument (proxy's tokens("prompt") for
// llmlb_prompt_tokens_total).
func registeredMetrics(t *testing.T) []string {
	t.Helper()
	names := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (n == "testdata" || n == "e2e" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		builders := map[string]string{} // helper variable -> suffix
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if s, err := strconv.Unquote(n.Value); n.Kind == token.STRING && err == nil && wholeMetricName.MatchString(s) {
					names[s] = true
				}
			case *ast.AssignStmt:
				if len(n.Lhs) != 1 || len(n.Rhs) != 1 {
					break
				}
				id, ok1 := n.Lhs[0].(*ast.Ident)
				fl, ok2 := n.Rhs[0].(*ast.FuncLit)
				if ok1 && ok2 {
					if suffix := builtSuffix(fl); suffix != "" {
						builders[id.Name] = suffix
					}
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			id, ok := call.Fun.(*ast.Ident)
			if !ok || builders[id.Name] == "" {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if arg, err := strconv.Unquote(lit.Value); err == nil {
					names["llmlb_"+arg+builders[id.Name]] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// builtSuffix returns the suffix of a name fl builds as "llmlb_" +
// variable + "suffix", or "".
func builtSuffix(fl *ast.FuncLit) string {
	var suffix string
	ast.Inspect(fl.Body, func(n ast.Node) bool {
		outer, ok := n.(*ast.BinaryExpr)
		if !ok || outer.Op != token.ADD {
			return true
		}
		inner, ok := outer.X.(*ast.BinaryExpr)
		if !ok || inner.Op != token.ADD {
			return true
		}
		head, ok1 := inner.X.(*ast.BasicLit)
		tail, ok2 := outer.Y.(*ast.BasicLit)
		if !ok1 || !ok2 || head.Value != `"llmlb_"` {
			return true
		}
		if s, err := strconv.Unquote(tail.Value); err == nil {
			suffix = s
		}
		return false
	})
	return suffix
}

// TestDocsMetricsTableMatchesCode: docs/operations.md has one metrics
// table, and its rows are the metrics the code registers, no more and no
// fewer.
func TestDocsMetricsTableMatchesCode(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, MetricsPage))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("| metric | type | labels |")); n != 1 {
		t.Errorf("%s has %d metrics tables, want 1", MetricsPage, n)
	}
	documented := DocumentedMetrics(t, filepath.Join(root, MetricsPage))
	registered := registeredMetrics(t)
	for _, name := range registered {
		if !slices.Contains(documented, name) {
			t.Errorf("the code registers %s, which %s does not document", name, MetricsPage)
		}
	}
	for _, name := range documented {
		if !slices.Contains(registered, name) {
			t.Errorf("%s documents %s, which the code does not register", MetricsPage, name)
		}
	}
}

// TestDocsStatusTableInOrder: the status codes of docs/http-api.md's table
// are in order.
func TestDocsStatusTableInOrder(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "http-api.md"))
	if err != nil {
		t.Fatal(err)
	}
	var codes []int
	for _, m := range regexp.MustCompile(`(?m)^\| ([1-5][0-9][0-9]) \| `).FindAllSubmatch(b, -1) {
		c, _ := strconv.Atoi(string(m[1]))
		codes = append(codes, c)
	}
	if len(codes) < 8 || !slices.IsSorted(codes) {
		t.Errorf("docs/http-api.md's status table is out of order: %v", codes)
	}
}
