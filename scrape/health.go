package scrape

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/llmlb/llmlb/balancer"
)

// probeRound runs one health probe and, when due, a model refresh.
func (t *Target) probeRound(ctx context.Context) {
	err := t.probe(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		t.failures = 0
		if !t.configured && (t.spec.Models == nil || t.now().Sub(t.modelsAt) >= t.cfg.ModelsInterval) {
			t.refreshModels(ctx)
		}
		if t.spec.State != balancer.StateReady {
			t.logger.Info("backend up", "backend", t.spec.ID)
		}
		t.spec.State, t.spec.Reason = balancer.StateReady, ""
		return
	}
	t.failures++
	if t.failures >= t.cfg.UnhealthyAfter && t.spec.State != balancer.StateDown {
		t.spec.State, t.spec.Reason = balancer.StateDown, "health check failed: "+err.Error()
		t.logger.Warn("backend down", "backend", t.spec.ID, "err", err)
	}
}

// readmit probes a backend that passive health ejected, once its ejection
// time is over, and tells the balancer whether it answers: its health
// check, then a short streaming completion that must end whole. It runs on
// the scrape tick, so a backend returns within a scrape interval of its
// time.
// Each data-parallel rank is ejected and readmitted on its own, its
// completion sent to that rank.
func (t *Target) readmit(ctx context.Context) {
	for _, s := range t.specs() {
		if !t.ledgerOf(s.ID).ReadmitDue(t.now()) {
			continue
		}
		err := t.probe(ctx)
		if err == nil {
			t.failures = 0
			err = t.probeGeneration(ctx, s)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			t.logger.Debug("ejected backend not readmitted", "backend", s.ID, "err", err)
		}
		t.bal.Probed(s.ID, err == nil)
	}
}

// probeGeneration asks the backend for a streaming completion of
// ReadmitTokens tokens and reads it to its [DONE]: what users get, not
// what the health route says. A backend whose models are not known yet,
// or with ReadmitTokens 0, is not asked.
func (t *Target) probeGeneration(ctx context.Context, s balancer.Spec) error {
	if t.cfg.ReadmitTokens == 0 || len(t.spec.Models) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.ReadmitTimeout)
	defer cancel()
	u := t.spec.URL.JoinPath("/v1/completions")
	body, _ := json.Marshal(map[string]any{"model": t.spec.Models[0], "prompt": "ping", "max_tokens": t.cfg.ReadmitTokens,
		"stream": true, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.Ranked {
		req.Header.Set(balancer.HeaderDataParallelRank, strconv.Itoa(s.Rank))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readmission completion %s: status %d", u, resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		if bytes.Equal(bytes.TrimSpace(sc.Bytes()), []byte("data: [DONE]")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("readmission completion %s: %w", u, err)
	}
	return fmt.Errorf("readmission completion %s: stream ended without [DONE]", u)
}

// probe GETs the health path.
func (t *Target) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	u := t.spec.URL.JoinPath(t.healthPath)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("health %s: status %d", u, resp.StatusCode)
	}
	return nil
}
