package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/llmlb/llmlb/balancer"
)

// Fleet is the state replicas of llmlb share (package cluster, wired by
// serve): the keys' limits and the sessions' homes. A call returns at
// once, or within a small bound, and an error means the state is out of
// reach: the proxy goes on with its own, as an llmlb alone does.
type Fleet interface {
	// Take checks a request of tokens against key's limits per minute
	// across the fleet and takes it from them when both allow it.
	Take(ctx context.Context, key string, requests, tokens, n int) (FleetVerdict, error)
	// Charge takes n more tokens from key's tokens limit (gives them back,
	// n negative), written behind the request.
	Charge(key string, requests, tokens, n int)
	// Home returns the backend ID the fleet holds for session, "" for none.
	Home(ctx context.Context, session string) (string, error)
	// SetHome makes id the session's home, written behind the request.
	SetHome(session, id string)
	// RefuseWhenDown reports whether a limited key's requests are refused
	// while the state is out of reach, rather than limited locally.
	RefuseWhenDown() bool
}

// FleetVerdict is what the fleet's limits say of one request.
type FleetVerdict struct {
	// Refused is "" when admitted, else "requests" or "tokens".
	Refused string
	// Wait is, when refused, how long until the request would be admitted.
	Wait time.Duration
	// RequestsUsed and TokensUsed are how far each allowance is from whole
	// after the request, as the time it takes to refill.
	RequestsUsed, TokensUsed time.Duration
}

// fleetDownError refuses a limited key's request while the fleet's limits
// are out of reach and cluster.limits_when_down is refuse.
type fleetDownError struct{ err error }

func (e *fleetDownError) Error() string { return "fleet limits unavailable: " + e.err.Error() }
func (e *fleetDownError) Unwrap() error { return e.err }

// httpError answers 503 with Retry-After, in OpenAI's shape.
func (e *fleetDownError) httpError() *HTTPError {
	return &HTTPError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "rate_limits_unavailable", Err: e, RetryAfter: time.Second,
		Msg: "This API key's rate limits are kept for the whole fleet, which cannot be reached now; retry shortly."}
}

// admitFleet takes the request from t's limits across the fleet. It
// reports false when the fleet's state is out of reach and the key's
// limits are to be kept locally.
func (s *Server) admitFleet(ex *exchange, t *tenant, est int) (bool, error) {
	rpm, tpm := t.limiter.limits()
	if rpm == 0 && tpm == 0 {
		return false, nil
	}
	v, err := s.fleet.Take(ex.client, t.name, rpm, tpm, est)
	if err != nil {
		if s.fleet.RefuseWhenDown() {
			return true, &fleetDownError{err: err}
		}
		return false, nil
	}
	q := quota{requests: fleetState(rpm, v.RequestsUsed), tokens: fleetState(tpm, v.TokensUsed)}
	q.setHeaders(ex.w.Header())
	switch v.Refused {
	case "requests":
		return true, &rateLimitError{kind: "requests", limit: rpm, wait: v.Wait}
	case "tokens":
		return true, &rateLimitError{kind: "tokens", limit: tpm, wait: v.Wait}
	}
	ex.admitted, ex.fleetAdmitted = est, true
	return true, nil
}

// fleetState is a limit of perMinute (0: unlimited) that is used as far as
// refilling takes, as the x-ratelimit-* headers say it.
func fleetState(perMinute int, used time.Duration) *limitState {
	if perMinute == 0 {
		return nil
	}
	b := bucket{limit: perMinute, per: time.Minute / time.Duration(perMinute)}
	return &limitState{limit: perMinute, remaining: max(0, int((time.Minute-used)/b.per)), reset: used}
}

// findHome asks the fleet for the request's session home; on an error the
// balancer's own table stands.
func (s *Server) findHome(ex *exchange, breq *balancer.Request) {
	if s.fleet == nil || breq.Session == "" {
		return
	}
	home, err := s.fleet.Home(ex.client, breq.Session)
	if err != nil {
		return
	}
	breq.SessionHome = home
}

// keepHome makes the backend the pick chose the session's home for the
// fleet, for cluster.session_ttl from now.
func (s *Server) keepHome(breq *balancer.Request, dec balancer.Decision) {
	if s.fleet == nil || breq.Session == "" {
		return
	}
	s.fleet.SetHome(breq.Session, dec.Candidates[0].ID)
}
