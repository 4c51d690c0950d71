package proxy

import (
	"net/http"
	"slices"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/llmlb/llmlb/balancer"
)

// serveStored handles a request on a stored response by its id (GET and
// DELETE /v1/responses/{id}, and suffix "/cancel" or "/input_items"): it
// goes to the backend the id's tag names and nowhere else, with the
// server's own id in the path; the answer's response ids are tagged on
// the way out. A key must allow a model that backend serves.
func (s *Server) serveStored(suffix string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ex := exchangeFrom(r.Context())
		ex.inference = true
		ex.req = &Request{Kind: KindStored, Stream: r.URL.Query().Get("stream") == "true"}
		if err := s.authorize(ex, r); err != nil {
			s.fail(ex, err)
			return
		}
		id := chi.URLParam(r, "id")
		be, orig, err := s.storedHolder("response_id", id)
		if err == nil && ex.tenant != nil && !s.mayReach(ex.tenant, be) {
			// As for a model the key may not use: the same answer as
			// for an id that leads nowhere.
			err = responseIDError("response_id", id, "was not handed out by this load balancer, which cannot tell the server that stores it.", http.StatusNotFound)
		}
		if err != nil {
			s.fail(ex, err)
			return
		}
		in := *r.URL
		in.Path, in.RawPath = "/v1/responses/"+orig+suffix, ""
		ex.inURL = &in
		ex.holder = be
		ex.guard = s.bal.NewGuard()
		if ex.req.Stream {
			ex.guard.Stream()
		}
		ex.guard.Attach(be, balancer.Work{}, time.Now())
		ex.dec = balancer.Decision{Candidates: []*balancer.Backend{be}, Reason: balancer.ReasonStored}
		ex.picked, ex.forwarded = true, true
		s.rp.ServeHTTP(ex.w, r.WithContext(r.Context()))
	}
}

// mayReach reports whether tenant t may use some model backend be
// serves, under its own name or a public name that routes to it.
func (s *Server) mayReach(t *tenant, be *balancer.Backend) bool {
	serves := func(m string) bool { return t.allows(m) }
	if slices.ContainsFunc(be.Models, serves) {
		return true
	}
	for _, a := range be.Adapters {
		if t.allows(a.Name) {
			return true
		}
	}
	for _, name := range s.bal.PublicModels() {
		if t.allows(name) && slices.ContainsFunc(s.bal.RouteTargets(name), be.Serves) {
			return true
		}
	}
	return false
}
