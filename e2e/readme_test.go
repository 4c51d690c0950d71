package e2e

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEStatements holds README to the statements issue 18 found
// false or missing: routing is by estimated time to first token, there is
// one metrics table, the status table is in order, every config key sits
// in its own section's table.
func TestREADMEStatements(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if !strings.Contains(readme, "| `ttft` (default) |") {
		t.Error("README's policy table does not name ttft the default")
	}
	if regexp.MustCompile(`(?i)least[ -]in[ -]flight`).MatchString(readme) {
		t.Error("README still calls routing least in-flight")
	}
	if n := strings.Count(readme, "| metric | type | labels |"); n != 1 {
		t.Errorf("README has %d metrics tables, want 1", n)
	}
	if n, m := len(regexp.MustCompile("(?m)^\\| `llmlb_[a-z_]+` \\|").FindAllString(readme, -1)), len(documentedMetrics(t)); n != m {
		t.Errorf("README has %d metric rows, %d of them in the metrics table: another table lists metrics", n, m)
	}
	var codes []int
	for _, m := range regexp.MustCompile(`(?m)^\| ([1-5][0-9][0-9]) \| `).FindAllStringSubmatch(readme, -1) {
		c, _ := strconv.Atoi(m[1])
		codes = append(codes, c)
	}
	if len(codes) < 8 || !slices.IsSorted(codes) {
		t.Errorf("README's status table is out of order: %v", codes)
	}
	// Each table of config keys holds one section's keys, under a line
	// naming the section.
	var table []string
	check := func() {
		tops := map[string]bool{}
		for _, row := range table {
			if m := regexp.MustCompile("^\\| `([a-z_]+)(\\[\\])?\\.").FindStringSubmatch(row); m != nil {
				tops[m[1]] = true
			}
		}
		if len(tops) > 1 {
			t.Errorf("one config table mixes the sections %v", tops)
		}
		table = nil
	}
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "|") {
			table = append(table, line)
		} else if table != nil {
			check()
		}
	}
}
