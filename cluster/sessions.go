package cluster

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
)

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
