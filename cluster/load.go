package cluster

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmlb/llmlb/balancer"
)

// Each replica's load is a hash of its own, field per backend ID, value
// "in-flight open-tokens", and a field "_" that
// says it is alive; the hash expires after [Config.loadTTL], so a replica
// that stops writing stops counting. A sorted set of replica IDs, scored
// by when each last wrote, lets a replica find the others without
// scanning the keyspace.

// aliveField is the field every published load has, idle or not.
const aliveField = "_"

// shareLoad publishes this replica's load, reads the others', and hands
// their sum to each backend's ledger.
func (c *Cluster) shareLoad(ctx context.Context) {
	snap := c.bal.Snapshot()
	now := time.Now()
	fields := []any{aliveField, strconv.FormatInt(now.UnixMilli(), 10)}
	for _, be := range snap.Backends {
		if l := be.Ledger.Own(); l != (balancer.Load{}) {
			fields = append(fields, be.ID, formatLoad(l))
		}
	}
	ttl := c.cfg.loadTTL()
	mine, set := c.key("load", c.id), c.key("replicas")
	// A replica unheard for many TTLs leaves the set; its hash is gone.
	window := 20 * ttl
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Redis.Timeout)
	defer cancel()
	pipe := c.rdb.TxPipeline()
	pipe.Del(ctx, mine)
	pipe.HSet(ctx, mine, fields...)
	pipe.PExpire(ctx, mine, ttl)
	pipe.ZAdd(ctx, set, redis.Z{Score: float64(now.UnixMilli()), Member: c.id})
	pipe.ZRemRangeByScore(ctx, set, "-inf", strconv.FormatInt(now.Add(-window).UnixMilli(), 10))
	ids := pipe.ZRange(ctx, set, 0, -1)
	if _, err := pipe.Exec(ctx); err != nil {
		c.failed(ctx, opLoad, err)
		return
	}
	var others []*redis.MapStringStringCmd
	read := c.rdb.Pipeline()
	for _, id := range ids.Val() {
		if id != c.id {
			others = append(others, read.HGetAll(ctx, c.key("load", id)))
		}
	}
	if len(others) > 0 {
		if _, err := read.Exec(ctx); err != nil {
			c.failed(ctx, opLoad, err)
			return
		}
	}
	sum := map[string]balancer.Load{}
	heard := 1
	for _, cmd := range others {
		m := cmd.Val()
		if _, ok := m[aliveField]; !ok {
			continue // expired: that replica stopped
		}
		heard++
		for id, v := range m {
			if id == aliveField {
				continue
			}
			if l, ok := parseLoad(v); ok {
				sum[id] = sum[id].Add(l)
			}
		}
	}
	for _, be := range snap.Backends {
		be.Ledger.SetPeers(sum[be.ID])
	}
	c.m.replicas.Set(float64(heard))
}

// clearPeers forgets the other replicas' load: a replica alone counts
// only its own.
func (c *Cluster) clearPeers() {
	if c.bal == nil {
		return
	}
	for _, be := range c.bal.Snapshot().Backends {
		be.Ledger.SetPeers(balancer.Load{})
	}
}

// retire removes this replica's load at shutdown, so that the others stop
// counting it at once rather than when it expires.
func (c *Cluster) retire() {
	if !c.up.Load() || !c.cfg.ShareLoad {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Redis.Timeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	pipe.Del(ctx, c.key("load", c.id))
	pipe.ZRem(ctx, c.key("replicas"), c.id)
	_, _ = pipe.Exec(ctx) // at shutdown; the TTL does it otherwise
}

// formatLoad writes l as a published field's value.
func formatLoad(l balancer.Load) string {
	return strconv.FormatInt(l.InFlight, 10) + " " + strconv.FormatInt(l.OpenTokens, 10)
}

// maxLoad bounds each figure read from another replica, so that no sum
// overflows whatever a stray writer put in Redis.
const maxLoad = 1 << 40

// parseLoad reads a published field's value: two non-negative integers.
func parseLoad(s string) (balancer.Load, bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return balancer.Load{}, false
	}
	var v [2]int64
	for i, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 || n > maxLoad {
			return balancer.Load{}, false
		}
		v[i] = n
	}
	return balancer.Load{InFlight: v[0], OpenTokens: v[1]}, true
}
