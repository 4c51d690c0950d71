package scrape

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// Auto is the engine name that asks llmlb to tell a backend's engine from
// the server itself (see [EngineSet.Detect]); it is the default.
const Auto = "auto"

// familyHints name the engine whose metric families start with a prefix,
// for pages that no engine row reads a signal from (a release that renamed
// every gauge, or Triton serving a model without the TensorRT-LLM backend's
// batch statistics, which has nv_inference_* but no nv_trt_llm_*).
var familyHints = []struct{ prefix, engine string }{
	{"vllm:", "vllm"},
	{"sglang:", "sglang"},
	{"nv_trt_llm_", "triton-tensorrt-llm"},
	{"nv_inference_", "triton-tensorrt-llm"},
	{"trtllm_", "trtllm-serve"},
}

// ownerEngines maps the owned_by of a server's /v1/models entries to the
// engine that writes it: vLLM's ModelCard says "vllm", SGLang's "sglang",
// trtllm-serve's "tensorrt_llm" (each in its openai protocol module).
var ownerEngines = map[string]string{
	"vllm":         "vllm",
	"sglang":       "sglang",
	"tensorrt_llm": "trtllm-serve",
}

// Detection is what a backend's own pages say about its engine.
type Detection struct {
	// Engine is the row that reads the page best; nil when nothing on the
	// pages (nor the model list) names a known engine.
	Engine *Engine
	// Reading is Engine's reading of its page; zero when Engine is nil or
	// was chosen by the model list alone.
	Reading Reading
	// By says what decided: "signals" (the row reads the most signals),
	// "families" (no row reads a signal, but the page's metric families
	// are that engine's) or "models" (the /v1/models owner).
	By string
}

// score ranks one row on a page: signals it reads, then whether the page
// has its engine's families.
type score struct{ signals, families int }

func (a score) less(b score) bool {
	if a.signals != b.signals {
		return a.signals < b.signals
	}
	return a.families < b.families
}

// Detect returns the row of s that reads page best: the one that finds the
// most signals on it; when none finds any, the engine whose metric families
// the page has. Ties go to the first name in sorted order. Engine is nil
// when no row finds a signal and no known family is on the page.
func (s EngineSet) Detect(page []byte, at time.Time) Detection {
	pages := map[string][]byte{}
	for _, name := range s.Names() {
		pages[s[name].MetricsPath] = page
	}
	return s.detect(pages, "", nil, at)
}

// detect ranks every row of s on the page at its own metrics path (pages
// maps path to page; rows whose page is absent are skipped), then falls
// back to owners, the owned_by values of the server's model list. override
// is the backend's own metrics path, which every row then shares.
func (s EngineSet) detect(pages map[string][]byte, override string, owners []string, at time.Time) Detection {
	var best Detection
	var bestScore score
	families := map[string]map[string]bool{} // by path: engines whose families the page has
	for _, name := range s.Names() {
		e := s[name]
		path := e.MetricsPath
		if override != "" {
			path = override
		}
		page, ok := pages[path]
		if !ok {
			continue
		}
		if families[path] == nil {
			families[path] = pageFamilies(page)
		}
		r, err := e.Extract(page, at)
		if err != nil {
			continue
		}
		sc := score{signals: len(r.Used)}
		if families[path][name] {
			sc.families = 1
		}
		if sc == (score{}) || !bestScore.less(sc) {
			continue
		}
		best, bestScore = Detection{Engine: e, Reading: r, By: "signals"}, sc
		if sc.signals == 0 {
			best.By = "families"
		}
	}
	if best.Engine != nil {
		return best
	}
	for _, o := range owners {
		if e := s[ownerEngines[o]]; e != nil {
			return Detection{Engine: e, By: "models"}
		}
	}
	return Detection{}
}

// pageFamilies returns the engines of [familyHints] whose metric families
// the page has.
func pageFamilies(page []byte) map[string]bool {
	found := map[string]bool{}
	sampleLines(page, func(line []byte) bool {
		for _, h := range familyHints {
			if bytes.HasPrefix(line, []byte(h.prefix)) {
				found[h.engine] = true
			}
		}
		return true
	})
	return found
}

// fetchPages GETs base's metrics page at each distinct path the rows of s
// use (or at override alone), keeping those that answer a non-empty
// Prometheus text page. The error is the first failure, for when no page
// could be read at all.
func (s EngineSet) fetchPages(ctx context.Context, client *http.Client, base *url.URL, override string, timeout time.Duration) (map[string][]byte, error) {
	var paths []string
	if override != "" {
		paths = []string{override}
	} else {
		for _, e := range s {
			if e.MetricsPath != "" && !slices.Contains(paths, e.MetricsPath) {
				paths = append(paths, e.MetricsPath)
			}
		}
		slices.Sort(paths)
	}
	pages := map[string][]byte{}
	var errs []error
	for _, p := range paths {
		page, err := fetchPage(ctx, client, base.JoinPath(p).String(), timeout)
		if err == nil && !hasSample(page) {
			err = &scrapeError{"empty", ErrNoData}
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pages[p] = page
	}
	if len(pages) == 0 && len(errs) > 0 {
		return nil, errs[0]
	}
	return pages, nil
}

// errNotDetected says a backend's pages were read but name no known engine.
var errNotDetected = errors.New("no engine row reads a signal from the metrics page and it has no known engine's metric families")
