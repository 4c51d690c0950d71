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
	// Admit asks the fleet about one request in one round trip: with
	// limits per minute (requests, tokens; both 0: none), it checks a
	// request of n tokens against key's and takes it from them when both
	// allow it; with a session ("": none), it returns the backend ID the
	// fleet holds for it, "" for none.
	Admit(ctx context.Context, key string, requests, tokens, n int, session string) (FleetVerdict, string, error)
	// Charge takes n more tokens from key's tokens limit (gives them back,
	// n negative), written behind the request.
	Charge(key string, requests, tokens, n int)
	// SetHome makes id the session's home, written behind the request.
	SetHome(session, id string)
	// Up reports whether the fleet's state answers.
	Up() bool
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

// admitFleet asks the fleet, in one round trip, for the request's
// session home and to take the request from t's limits (nil t: no
// limits). It reports false when t's limits are to be kept locally: it
// has none, or the fleet's state is out of reach.
func (s *Server) admitFleet(ex *exchange, r *http.Request, t *tenant, est int) (bool, error) {
	var rpm, tpm int
	var name string
	if t != nil {
		rpm, tpm = t.limiter.limits()
		name = t.name
	}
	var session string
	if s.sessionHeader != "" {
		session = r.Header.Get(s.sessionHeader)
	}
	if rpm == 0 && tpm == 0 && session == "" {
		return false, nil
	}
	v, home, err := s.fleet.Admit(ex.client, name, rpm, tpm, est, session)
	if err != nil {
		if (rpm > 0 || tpm > 0) && s.fleet.RefuseWhenDown() {
			return true, &fleetDownError{err: err}
		}
		return false, nil
	}
	ex.sessionHome = home
	if rpm == 0 && tpm == 0 {
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

// findHome gives the balancer the session's home the fleet holds, as
// admitFleet found it; "" leaves the balancer's own table to decide.
func (s *Server) findHome(ex *exchange, breq *balancer.Request) {
	if breq.Session != "" {
		breq.SessionHome = ex.sessionHome
	}
}

// keepHome makes the backend the pick chose the session's home for the
// fleet when it is not already (the read that found it kept it).
func (s *Server) keepHome(breq *balancer.Request, dec balancer.Decision) {
	if s.fleet == nil || breq.Session == "" || dec.Candidates[0].ID == breq.SessionHome {
		return
	}
	s.fleet.SetHome(breq.Session, dec.Candidates[0].ID)
}
