package balancer

// Explanation is a dry-run pick, for /debug/route: every backend with why
// it was left out or how it scored, and what would be chosen.
type Explanation struct {
	Policy string `json:"policy"`
	Model  string `json:"model"`
	// Tier is which backends were candidates: fresh (ready with fresh
	// metrics), stale or unknown.
	Tier         string             `json:"tier"`
	PromptTokens int                `json:"prompt_tokens"`
	Backends     []BackendBreakdown `json:"backends"`
	// Chosen are the backends the request would be tried on, best first,
	// by ID; ChosenNames the same by Name, as x-llmlb-backend shows them.
	Chosen      []string `json:"chosen"`
	ChosenNames []string `json:"chosen_names"`
	Reason      Reason   `json:"reason"`
	Error       string   `json:"error,omitempty"`
}

// BackendBreakdown is one backend in an [Explanation].
type BackendBreakdown struct {
	// ID is the backend's URL; Name is what clients see of it in
	// x-llmlb-backend ([Backend.Name]).
	ID   string `json:"id"`
	Name string `json:"name"`
	// Excluded says why the backend was not a candidate; empty if it was.
	Excluded string `json:"excluded,omitempty"`
	// Score is the weighted total in [0,1] (higher is better), for pickers
	// that score.
	Score float64 `json:"score"`
	*Candidate
}

func (e *Explanation) skip(be *Backend, why string) {
	if e != nil {
		e.Backends = append(e.Backends, BackendBreakdown{ID: be.ID, Name: be.Name, Excluded: why})
	}
}

func (e *Explanation) add(c *Candidate, score float64, why string) {
	if e != nil {
		cc := *c
		e.Backends = append(e.Backends, BackendBreakdown{ID: c.Backend.ID, Name: c.Backend.Name, Excluded: why, Score: score, Candidate: &cc})
	}
}

// Explain runs the pick for req without sending anything or changing any
// state (the prefix index, the pickers' and scorers' state and the
// sessions are left as they are) and returns every backend's breakdown.
func (b *Balancer) Explain(req *Request) Explanation {
	ex := &Explanation{Policy: b.pol.name, Model: req.Model, PromptTokens: req.PromptTokens}
	_, err := b.pick(req, nil, true, ex)
	if err != nil {
		ex.Error = err.Error()
	}
	return *ex
}
