package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// detectDue reports whether a detection may run now: the first at once,
// then at most one a health interval, so a page that names no engine is
// not fetched at every path on every scrape.
func (t *Target) detectDue() bool {
	if !t.detectedAt.IsZero() && t.now().Sub(t.detectedAt) < t.cfg.HealthInterval {
		return false
	}
	t.detectedAt = t.now()
	return true
}

// runDetect fetches the backend's pages at every row's metrics path and
// ranks the rows on them (see [EngineSet.Detect]); the model list's owners
// decide when the pages do not.
func (t *Target) runDetect(ctx context.Context) (Detection, error) {
	pages, err := t.engines.fetchPages(ctx, t.client, t.spec.URL, t.metricsPath, t.cfg.ScrapeTimeout)
	if err != nil {
		return Detection{}, err
	}
	return t.engines.detect(pages, t.metricsPath, t.owners, t.now()), nil
}

// detect chooses the engine of a backend declared auto.
func (t *Target) detect(ctx context.Context) {
	if !t.detectDue() {
		return
	}
	d, err := t.runDetect(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		t.failed(fmt.Errorf("detect engine: %w", err))
		return
	}
	if d.Engine == nil {
		if !t.undetected {
			t.logger.Warn("backend engine not detected; name it with engine: in the backend's entry", "backend", t.spec.ID, "err", errNotDetected)
		}
		t.undetected = true
		t.spec.Warning = "engine not detected: " + errNotDetected.Error()
		return
	}
	t.undetected = false
	t.spec.Warning = ""
	t.setEngine(d.Engine)
	t.logger.Info("backend engine detected", "backend", t.spec.ID, "engine", d.Engine.Name, "by", d.By)
	if d.By != "models" {
		t.accept(d.Reading)
	}
}

// recheck runs when the backend's row reads nothing from its page. A
// backend declared auto takes the row that now reads its page (the server
// behind the address changed). A declared engine that the page
// contradicts is reported once, loudly (log, metric, status page), and the
// page is read with the row it matches until the config is fixed: reading
// it with the declared row would leave every signal unknown and the
// backend looking idle (issue 18). A mismatch by the model list alone is
// not reported: owned_by is a weaker witness than the metrics. It reports
// whether the backend now has another row, its page already read.
func (t *Target) recheck(ctx context.Context) bool {
	if !t.detectDue() {
		return false
	}
	d, err := t.runDetect(ctx)
	if ctx.Err() != nil || err != nil || d.Engine == nil || d.Engine == t.engine {
		return false
	}
	switch {
	case t.declared == Auto:
		t.logger.Info("backend engine changed", "backend", t.spec.ID, "from", t.engine.Name, "to", d.Engine.Name, "by", d.By)
	case d.Engine.Name == t.declared: // the server is what config says again
		t.clearMismatch()
		t.logger.Info("backend engine matches its declaration again", "backend", t.spec.ID, "engine", t.declared)
	case d.By == "models":
		return false
	default:
		t.clearMismatch()
		t.mismatch = d.Engine.Name
		t.metrics.mismatch.WithLabelValues(t.spec.ID, t.declared, d.Engine.Name).Set(1)
		t.spec.Warning = fmt.Sprintf("declared engine %s, but the server exposes %s's metrics (%s); read as %s: set engine: %s or auto",
			t.declared, d.Engine.Name, d.By, d.Engine.Name, d.Engine.Name)
		t.logger.Error("backend engine contradicts its metrics; reading them as the engine they match", "backend", t.spec.ID,
			"declared", t.declared, "detected", d.Engine.Name, "by", d.By)
	}
	t.resetMissing()
	t.setEngine(d.Engine)
	if d.By == "models" {
		return false
	}
	t.accept(d.Reading)
	return true
}

// clearMismatch withdraws a reported engine mismatch.
func (t *Target) clearMismatch() {
	if t.mismatch == "" {
		return
	}
	t.metrics.mismatch.DeleteLabelValues(t.spec.ID, t.declared, t.mismatch)
	t.mismatch, t.spec.Warning = "", ""
}
