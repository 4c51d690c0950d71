package serve

import (
	"context"

	"github.com/llmlb/llmlb/cluster"
	"github.com/llmlb/llmlb/proxy"
)

// fleet is the cluster as the proxy asks it ([proxy.Fleet]).
type fleet struct{ c *cluster.Cluster }

var _ proxy.Fleet = fleet{}

func (f fleet) Admit(ctx context.Context, key string, requests, tokens, n int, session string) (proxy.FleetVerdict, string, error) {
	v, home, err := f.c.Admit(ctx, key, cluster.Limits{Requests: requests, Tokens: tokens}, n, session)
	return proxy.FleetVerdict{Refused: v.Refused, Wait: v.Wait, RequestsUsed: v.RequestsUsed, TokensUsed: v.TokensUsed}, home, err
}

func (f fleet) Charge(key string, requests, tokens, n int) {
	f.c.Charge(key, cluster.Limits{Requests: requests, Tokens: tokens}, n)
}

func (f fleet) SetHome(session, id string) { f.c.SetHome(session, id) }

func (f fleet) Up() bool { return f.c.Up() }

func (f fleet) RefuseWhenDown() bool { return f.c.LimitsWhenDown() == cluster.LimitsRefuse }
