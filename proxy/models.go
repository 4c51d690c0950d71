package proxy

import (
	"net/http"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/balancer"
)

// modelCard is one entry of GET /v1/models, in vLLM's shape.
type modelCard struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

// serveModels answers the models served by ready backends, each once, base
// models first, sorted by name.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	ex := exchangeFrom(r.Context())
	t, err := s.authenticate(r)
	if err != nil {
		s.fail(ex, err)
		return
	}
	ex.tenant = t
	var cards []modelCard
	seen := map[string]bool{}
	var adapters []modelCard
	for _, be := range s.bal.Snapshot().Backends {
		if be.State != balancer.StateReady {
			continue
		}
		for _, m := range be.Models {
			if !seen[m] {
				seen[m] = true
				cards = append(cards, modelCard{ID: m, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: m})
			}
		}
		for _, a := range be.Adapters {
			if !seen[a.Name] {
				seen[a.Name] = true
				p := a.Parent
				adapters = append(adapters, modelCard{ID: a.Name, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: a.Name, Parent: &p})
			}
		}
	}
	byID := func(a, b modelCard) int { return strings.Compare(a.ID, b.ID) }
	for _, name := range s.bal.PublicModels() {
		if seen[name] {
			continue
		}
		for _, t := range s.bal.RouteTargets(name) {
			if seen[t] {
				seen[name] = true
				cards = append(cards, modelCard{ID: name, Object: "model", Created: s.started.Unix(), OwnedBy: "llmlb", Root: name})
				break
			}
		}
	}
	slices.SortFunc(cards, byID)
	slices.SortFunc(adapters, byID)
	cards = append(cards, adapters...)
	if t != nil {
		cards = slices.DeleteFunc(cards, func(c modelCard) bool { return !t.allows(c.ID) })
	}
	if cards == nil {
		cards = []modelCard{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": cards})
}
