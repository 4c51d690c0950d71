package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// modelList is the body of GET /v1/models as vLLM, SGLang and trtllm-serve
// answer it. vLLM lists each LoRA adapter with its base model in parent;
// owned_by names the engine ("vllm", "sglang", "tensorrt_llm").
type modelList struct {
	Data []struct {
		ID      string  `json:"id"`
		Parent  *string `json:"parent"`
		OwnedBy string  `json:"owned_by"`
	} `json:"data"`
}

// served is what a /v1/models answer says a server serves.
type served struct {
	models   []string           // base models, sorted; never nil
	adapters []balancer.Adapter // entries with a parent, sorted by name
	owners   []string           // distinct owned_by values, sorted
}

// refreshModels learns the backend's models and adapters. On failure the
// last known lists are kept.
func (t *Target) refreshModels(ctx context.Context) {
	sv, err := fetchModels(ctx, t.client, t.spec.URL, t.cfg.Timeout)
	if err != nil {
		if !t.modelsFailed {
			t.logger.Warn("model discovery failing", "backend", t.spec.ID, "err", err)
		}
		t.modelsFailed = true
		return
	}
	if t.modelsFailed {
		t.logger.Info("model discovery recovered", "backend", t.spec.ID)
	}
	t.modelsFailed = false
	t.modelsAt = t.now()
	t.spec.Models, t.spec.Adapters, t.owners = sv.models, sv.adapters, sv.owners
}

// FetchModels GETs base/v1/models and splits it into base models and
// adapters (entries with a parent, as vLLM lists them), each sorted. A
// backend's loop and `llmlb probe` use it.
func FetchModels(ctx context.Context, client *http.Client, base *url.URL, timeout time.Duration) ([]string, []balancer.Adapter, error) {
	sv, err := fetchModels(ctx, client, base, timeout)
	return sv.models, sv.adapters, err
}

func fetchModels(ctx context.Context, client *http.Client, base *url.URL, timeout time.Duration) (served, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := base.JoinPath("/v1/models")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return served{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return served{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return served{}, fmt.Errorf("models %s: status %d", u, resp.StatusCode)
	}
	sv, err := parseModelList(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return served{}, fmt.Errorf("models %s: %w", u, err)
	}
	return sv, nil
}

// parseModelList reads a /v1/models body and splits it into base models and
// adapters (entries with a parent), each sorted. Entries without an id are
// skipped.
func parseModelList(r io.Reader) (served, error) {
	var ml modelList
	if err := json.NewDecoder(r).Decode(&ml); err != nil {
		return served{}, err
	}
	sv := served{models: []string{}}
	for _, d := range ml.Data {
		if d.ID == "" {
			continue
		}
		if d.Parent != nil && *d.Parent != "" {
			sv.adapters = append(sv.adapters, balancer.Adapter{Name: d.ID, Parent: *d.Parent})
		} else {
			sv.models = append(sv.models, d.ID)
		}
		if d.OwnedBy != "" && !slices.Contains(sv.owners, d.OwnedBy) {
			sv.owners = append(sv.owners, d.OwnedBy)
		}
	}
	slices.Sort(sv.models)
	slices.Sort(sv.owners)
	slices.SortFunc(sv.adapters, func(a, b balancer.Adapter) int { return strings.Compare(a.Name, b.Name) })
	return sv, nil
}
