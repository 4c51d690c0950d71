package balancer

import (
	"slices"
	"time"
)

// route is a public model name's targets with cumulative weights.
type route struct {
	targets    []string
	cum        []float64
	priority   int
	ttft, tpot time.Duration // the model's default deadlines
}

// SetModels replaces the model aliases and splits, at once for every
// request routed after it returns. models must have passed ValidateModels.
func (b *Balancer) SetModels(models []ModelRoute) {
	r := newRoutes(models)
	b.routes.Store(&r)
}

func newRoutes(models []ModelRoute) map[string]*route {
	m := make(map[string]*route, len(models))
	for _, r := range models {
		rt := &route{priority: r.Priority, ttft: r.SLOTTFT, tpot: r.SLOTPOT}
		sum := 0.0
		for _, t := range r.Targets {
			w := t.Weight
			if len(r.Targets) == 1 && w <= 0 {
				w = 1
			}
			sum += w
			rt.targets = append(rt.targets, t.Model)
			rt.cum = append(rt.cum, sum)
		}
		m[r.Name] = rt
	}
	return m
}

// Route resolves a public model name to the model backends are asked for,
// choosing among weighted targets at random, and returns the model's
// default priority. A name with no route is its own target.
func (b *Balancer) Route(model string) (target string, priority int) {
	rt := (*b.routes.Load())[model]
	if rt == nil {
		return model, 0
	}
	if len(rt.targets) == 1 {
		return rt.targets[0], rt.priority
	}
	x := float64(b.rand()>>11) / (1 << 53) * rt.cum[len(rt.cum)-1]
	for i, c := range rt.cum {
		if x < c {
			return rt.targets[i], rt.priority
		}
	}
	return rt.targets[len(rt.targets)-1], rt.priority
}

// Deadlines returns the default deadlines of a public model name's
// requests (models[].slo_ttft, slo_tpot); 0 is none.
func (b *Balancer) Deadlines(model string) (ttft, tpot time.Duration) {
	if rt := (*b.routes.Load())[model]; rt != nil {
		return rt.ttft, rt.tpot
	}
	return 0, 0
}

// PublicModels returns the model names routes add, sorted.
func (b *Balancer) PublicModels() []string {
	routes := *b.routes.Load()
	out := make([]string, 0, len(routes))
	for name := range routes {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// RouteTargets returns the targets of a public model name, or nil.
func (b *Balancer) RouteTargets(model string) []string {
	if rt := (*b.routes.Load())[model]; rt != nil {
		return slices.Clone(rt.targets)
	}
	return nil
}
