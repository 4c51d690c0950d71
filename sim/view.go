package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// BackendView is the part of a backend's GET /debug/backends entry the live
// view shows.
type BackendView struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"` // what clients see in x-llmlb-backend
	URL         string   `json:"url"`
	State       string   `json:"state"`
	Engine      string   `json:"engine"`
	Stale       bool     `json:"metrics_stale"`
	Models      []string `json:"models"`
	InFlight    int64    `json:"in_flight"`
	Requests    int64    `json:"requests_total"`
	Failures    int64    `json:"failures_total"`
	TTFBSeconds float64  `json:"ttfb_seconds"`
	// Ejection is set while passive health has the backend out of
	// rotation.
	Ejection *struct {
		Reason string `json:"reason"`
	} `json:"ejection"`
	// Labels are the backend's labels from config (the demo's gpu).
	Labels map[string]string `json:"labels"`
}

// FetchBackends reads the balancer's admin /debug/backends.
func FetchBackends(client *http.Client, adminURL string) ([]BackendView, error) {
	resp, err := client.Get(adminURL + "/debug/backends")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("debug/backends: status %d", resp.StatusCode)
	}
	var body struct {
		Backends []BackendView `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("debug/backends: %w", err)
	}
	return body.Backends, nil
}
