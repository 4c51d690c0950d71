package cluster

import (
	"context"
	"errors"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

// Home returns the backend ID the fleet's session table holds for
// session, "" for none. It returns [ErrDown] while Redis is down or when
// this call fails.
func (c *Cluster) Home(ctx context.Context, session string) (string, error) {
	ctx, cancel, ok := c.call(ctx)
	if !ok {
		return "", ErrDown
	}
	defer cancel()
	id, err := c.rdb.Get(ctx, c.sessionKey(session)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil
	case err != nil:
		c.failed(ctx, opSession, err)
		return "", ErrDown
	}
	return id, nil
}

// SetHome makes backend id session's home for cluster.session_ttl from
// now, written behind the request; false means it was dropped.
func (c *Cluster) SetHome(session, id string) bool {
	return c.enqueue(write{op: opSetSession, args: []any{"set", c.sessionKey(session), id, "px", c.cfg.SessionTTL.Milliseconds()}})
}

// sessionKey is a session's key: a hash of the client's value, so that
// no client text of any length becomes a key.
func (c *Cluster) sessionKey(session string) string {
	return c.key("session", strconv.FormatUint(xxhash.Sum64String(session), 16))
}
