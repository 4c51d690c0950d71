package proxy

import (
	"encoding/json"
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

// followResponse sends a request that continues a stored response to the
// backend storing it, and only there: its prompt is matched nowhere (the
// conversation so far is in that server's store, not in the request), and
// the body names the response by the server's own id.
func (s *Server) followResponse(ex *exchange, breq *balancer.Request) error {
	const param = "previous_response_id"
	id := ex.req.PreviousResponseID
	be, orig, err := s.storedHolder(param, id)
	if err != nil {
		return err
	}
	if !be.Serves(breq.Model) {
		return responseIDError(param, id, "is stored by a server that does not serve model "+quote(ex.req.Model)+".", http.StatusBadRequest)
	}
	val, _ := json.Marshal(orig)
	body, _, err := setField(ex.req.Body, param, val)
	if err != nil {
		return badRequest(param, "The request body could not be rewritten: %v.", err)
	}
	ex.req.Body = body
	ex.holder = be
	breq.Holder = be.ID
	breq.Prompt, breq.Parts, breq.FirstUser, breq.FirstTurn = nil, nil, 0, 0
	return nil
}

// storedHolder returns the backend storing the response a client names
// id, and the server's own id for it; an id that leads to no server that
// is up is an error saying so, in param.
func (s *Server) storedHolder(param, id string) (*balancer.Backend, string, error) {
	orig, tag, ok := splitResponseID(id)
	if !ok {
		return nil, "", responseIDError(param, id, "was not handed out by this load balancer, which cannot tell the server that stores it.", http.StatusNotFound)
	}
	be := holderOf(s.bal.Snapshot(), tag)
	switch {
	case be == nil:
		return nil, "", responseIDError(param, id, "is stored by a server this load balancer no longer routes to; the response is gone.", http.StatusNotFound)
	case be.State == balancer.StateDown || be.State == balancer.StateDraining:
		return nil, "", responseIDError(param, id, "is stored by server "+quote(be.Name)+", which is "+be.State.String()+"; try again once it is back.", http.StatusServiceUnavailable)
	}
	return be, orig, nil
}
