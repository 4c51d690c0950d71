package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The keys' limits are kept in Redis as the proxy keeps them in memory:
// the generic cell rate algorithm, one time per limit at which its
// allowance is whole again (its theoretical arrival time), each unit
// used pushing it a minute/limit further. One script checks and takes a
// request and its estimated tokens atomically, on the server's clock, so
// replicas' clocks need not agree; a key that expires is a whole
// allowance. Times are microseconds.
//
// KEYS[1], KEYS[2]: the requests and tokens limits' times.
// ARGV: requests per minute, tokens per minute (0: unlimited), tokens.
// Returns {refused (0, 1 requests, 2 tokens), wait, requests used,
// tokens used}, the used figures after the take, as times to refill.
var takeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local minute, maxdebt = 60000000, 1125899906842624
local rpm, tpm, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function used(key)
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  if tat < now then return 0 end
  return tat - now
end
local function store(key, u)
  if u <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%d', math.floor(now + u)), 'PX', math.floor(u / 1000) + 1000)
  end
end
local ur, ut, refused, wait = 0, 0, 0, 0
if rpm > 0 then
  ur = used(KEYS[1])
  local w = ur + minute / rpm - minute
  if w > 0 then refused, wait = 1, w end
end
if tpm > 0 then
  ut = used(KEYS[2])
  if refused == 0 then
    local w = ut + minute / tpm * math.min(n, tpm) - minute
    if w > 0 then refused, wait = 2, w end
  end
end
if refused == 0 then
  if rpm > 0 then
    ur = ur + minute / rpm
    store(KEYS[1], ur)
  end
  if tpm > 0 then
    ut = math.min(math.max(0, ut + minute / tpm * n), maxdebt)
    store(KEYS[2], ut)
  end
end
return {refused, math.floor(wait), math.floor(ur), math.floor(ut)}
`)

// chargeScript takes n more tokens (or gives them back, n negative) from
// a key's tokens limit: KEYS[1] its time, ARGV tokens per minute and n.
var chargeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local minute, maxdebt = 60000000, 1125899906842624
local tpm, n = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm <= 0 then return 0 end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local u = 0
if tat > now then u = tat - now end
u = math.min(math.max(0, u + minute / tpm * n), maxdebt)
if u <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], string.format('%d', math.floor(now + u)), 'PX', math.floor(u / 1000) + 1000)
end
return 0
`)

// Limits are a key's limits per minute; 0 is unlimited.
type Limits struct{ Requests, Tokens int }

// Verdict is what the fleet's limits say of one request.
type Verdict struct {
	// Refused is "" for an admitted request, else the limit it is over:
	// "requests" or "tokens".
	Refused string
	// Wait is, for a refused request, how long until it would be admitted.
	Wait time.Duration
	// RequestsUsed and TokensUsed are how far each allowance is from
	// whole after the request, as the time it takes to refill.
	RequestsUsed, TokensUsed time.Duration
}

// Admit asks the fleet about one request in one round trip: with
// limits, it checks the request against key's limits and, when both
// allow it, takes one request and tokens from them (tokens may exceed the
// limit: a request larger than the whole allowance is admitted when it is
// whole); with a session, it returns the session's home ("" for none).
// Either may be absent (l zero, session ""). It returns [ErrDown] while
// Redis is down, or when this call fails (which takes it down).
func (c *Cluster) Admit(ctx context.Context, key string, l Limits, tokens int, session string) (Verdict, string, error) {
	limited := l.Requests > 0 || l.Tokens > 0
	if !limited && session == "" {
		return Verdict{}, "", nil
	}
	ctx, cancel, ok := c.call(ctx)
	if !ok {
		return Verdict{}, "", ErrDown
	}
	defer cancel()
	var keys []string
	args := []any{l.Requests, l.Tokens, tokens}
	if limited {
		r, t := c.limitKeys(key)
		keys = []string{r, t}
	}
	run := func(script bool) (*redis.Cmd, *redis.StringCmd, error) {
		pipe := c.rdb.Pipeline()
		var take *redis.Cmd
		var home *redis.StringCmd
		if limited {
			if script {
				take = takeScript.Eval(ctx, pipe, keys, args...)
			} else {
				take = takeScript.EvalSha(ctx, pipe, keys, args...)
			}
		}
		if session != "" {
			// Read and keep: a session's home lives session_ttl past
			// its last request without a write per request.
			home = pipe.GetEx(ctx, c.sessionKey(session), c.cfg.SessionTTL)
		}
		_, err := pipe.Exec(ctx)
		if errors.Is(err, redis.Nil) {
			err = nil // no home: the session is new
		}
		return take, home, err
	}
	take, home, err := run(false)
	if isScriptMiss(err) {
		// The server does not hold the script (it restarted): send it whole.
		take, home, err = run(true)
	}
	op := opLimit
	if !limited {
		op = opSession
	}
	if err != nil {
		c.failed(ctx, op, err)
		return Verdict{}, "", ErrDown
	}
	var v Verdict
	if limited {
		res, err := take.Int64Slice()
		if err == nil && len(res) != 4 {
			err = fmt.Errorf("the limits script answered %d values, want 4", len(res))
		}
		if err != nil {
			c.failed(ctx, opLimit, err)
			return Verdict{}, "", ErrDown
		}
		v = Verdict{Wait: time.Duration(res[1]) * time.Microsecond,
			RequestsUsed: time.Duration(res[2]) * time.Microsecond, TokensUsed: time.Duration(res[3]) * time.Microsecond}
		switch res[0] {
		case 1:
			v.Refused = "requests"
		case 2:
			v.Refused = "tokens"
		}
	}
	var id string
	if home != nil {
		id = home.Val()
	}
	return v, id, nil
}

// Charge takes n more tokens from key's tokens limit (gives them back, n
// negative), once a request's real use is known. It is written behind
// the request; false means it was dropped (Redis down, queue full).
func (c *Cluster) Charge(key string, l Limits, n int) bool {
	if l.Tokens <= 0 || n == 0 {
		return true
	}
	_, t := c.limitKeys(key)
	return c.enqueue(write{op: opCharge, eval: chargeScript, keys: []string{t}, args: []any{l.Tokens, n}})
}

// limitKeys returns the keys of a key's two limits, the name in braces
// as a hash tag (the script touches both, which a Redis Cluster allows
// only within one slot).
func (c *Cluster) limitKeys(name string) (requests, tokens string) {
	base := c.key("limit", "{"+strconv.Quote(name)+"}")
	return base + ":requests", base + ":tokens"
}
