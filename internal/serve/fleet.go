package serve

import (
	"context"

	"github.com/llmlb/llmlb/cluster"
	"github.com/llmlb/llmlb/proxy"
)

// fleet is the cluster as the proxy asks it ([proxy.Fleet]).
type fleet struct{ c *cluster.Cluster }

var _ proxy.Fleet = fleet{}

func (f fleet) Take(ctx context.Context, key string, requests, tokens, n int) (proxy.FleetVerdict, error) {
	v, err := f.c.Take(ctx, key, cluster.Limits{Requests: requests, Tokens: tokens}, n)
	return proxy.FleetVerdict{Refused: v.Refused, Wait: v.Wait, RequestsUsed: v.RequestsUsed, TokensUsed: v.TokensUsed}, err
}

func (f fleet) Charge(key string, requests, tokens, n int) {
	f.c.Charge(key, cluster.Limits{Requests: requests, Tokens: tokens}, n)
}

func (f fleet) Home(ctx context.Context, session string) (string, error) {
	return f.c.Home(ctx, session)
}

func (f fleet) SetHome(session, id string) { f.c.SetHome(session, id) }

func (f fleet) RefuseWhenDown() bool { return f.c.LimitsWhenDown() == cluster.LimitsRefuse }
