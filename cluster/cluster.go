package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/llmlb/llmlb/balancer"
)

// ErrDown is returned by calls made while the fleet's state is out of
// reach: the caller goes on with its own.
var ErrDown = errors.New("cluster state unavailable")

// rejoinEvery is how often a replica that lost Redis tries it again.
const rejoinEvery = 500 * time.Millisecond

// queueLen bounds the writes waiting for Redis; past it they are dropped.
const queueLen = 4096

// Cluster is one replica's link to the fleet's state. Its methods are safe
// for concurrent use; the request path's calls ([Cluster.Take],
// [Cluster.Home]) return [ErrDown] at once while Redis is down, and wait
// at most RedisConfig.Timeout while it is up.
type Cluster struct {
	cfg    Config
	rdb    *redis.Client
	bal    *balancer.Balancer
	logger *slog.Logger
	id     string // this replica, in the load it publishes
	up     atomic.Bool
	writes chan write
	m      metrics

	// downMu serialises the log line and gauge of a change of state.
	downMu sync.Mutex
}

// write is a call whose answer no request waits for.
type write struct {
	op   string // for the dropped and errors metrics
	args []any
	eval *redis.Script // nil: args is a command
	keys []string
}

type metrics struct {
	up       prometheus.Gauge
	replicas prometheus.Gauge
	errors   *prometheus.CounterVec
	dropped  *prometheus.CounterVec
}

// New connects to cfg.Redis (the connection is made lazily; Run reports
// whether Redis answers) for the replica in front of bal's backends (nil:
// no load is shared), with
// what cfg's files hold ([Config.OpenFiles]), and registers its metrics on
// reg. cfg must have passed Validate and name an address.
func New(cfg Config, files Files, bal *balancer.Balancer, reg prometheus.Registerer, logger *slog.Logger) *Cluster {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if bal == nil {
		cfg.ShareLoad = false // no ledgers to publish or to give the peers' load
	}
	// The client's own messages (a failed dial, every time) repeat what
	// llmlb_cluster_errors_total counts and the one line a change of
	// state logs. The setting is the client library's, process-wide.
	redis.SetLogger(quiet{})
	opt := &redis.Options{
		Addr:                  cfg.Redis.Address,
		Username:              cfg.Redis.Username,
		Password:              cmp.Or(files.Password, cfg.Redis.Password),
		DB:                    cfg.Redis.DB,
		Protocol:              2,
		DialTimeout:           cfg.Redis.Timeout,
		ReadTimeout:           cfg.Redis.Timeout,
		WriteTimeout:          cfg.Redis.Timeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a failed call is the fleet's state down, not a reason to wait longer
		DialerRetries:         1,
		// Every request of a limited key or with a session makes a call:
		// a pool the request load does not queue on, since waiting for a
		// connection counts against the timeout.
		PoolSize:        256,
		MinIdleConns:    4,
		DisableIdentity: true,
		// No push notifications: plain Redis, Valkey and RESP2 have none.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		TLSConfig:                files.TLS,
	}
	c := &Cluster{cfg: cfg, rdb: redis.NewClient(opt), bal: bal, logger: logger, id: replicaID(), writes: make(chan write, queueLen)}
	c.m = metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmlb_cluster_up",
			Help: "1 while the fleet's state in Redis (cluster.redis) answers; 0 while this replica goes on alone."}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{Name: "llmlb_cluster_replicas",
			Help: "Replicas whose load this one heard at the last publish interval, itself included (cluster.share_load)."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmlb_cluster_errors_total",
			Help: "Calls to Redis that failed or timed out, by operation; each takes the fleet's state down until a ping answers."}, []string{"op"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llmlb_cluster_dropped_total",
			Help: "Writes to Redis not made, by operation: Redis was down or the write queue full."}, []string{"op"}),
	}
	for _, op := range []string{opLimit, opCharge, opSession, opSetSession, opLoad, opPing} {
		c.m.errors.WithLabelValues(op)
	}
	for _, op := range []string{opCharge, opSetSession} {
		c.m.dropped.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(c.m.up, c.m.replicas, c.m.errors, c.m.dropped)
	}
	return c
}

// quiet is a go-redis logger that says nothing.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Operations, as the metrics name them.
const (
	opLimit      = "limit"
	opCharge     = "charge"
	opSession    = "session"
	opSetSession = "set_session"
	opLoad       = "load"
	opPing       = "ping"
)

// replicaID names this process among the replicas: host, pid and a
// random part, so that a restarted replica is a new one.
func replicaID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// Up reports whether the fleet's state answers.
func (c *Cluster) Up() bool { return c.up.Load() }

// LimitsWhenDown returns cluster.limits_when_down.
func (c *Cluster) LimitsWhenDown() string { return c.cfg.LimitsWhenDown }

// key returns the prefixed key of parts.
func (c *Cluster) key(parts ...string) string {
	k := c.cfg.Redis.KeyPrefix
	for i, p := range parts {
		if i > 0 {
			k += ":"
		}
		k += p
	}
	return k
}

// call returns a context for one call on the request path, bounded by
// the timeout, or false while the state is down.
func (c *Cluster) call(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if !c.up.Load() {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Redis.Timeout)
	return ctx, cancel, true
}

// failed counts a failed call and takes the state down, unless the
// request that made it went away (its client's cancel is not Redis's
// fault).
func (c *Cluster) failed(ctx context.Context, op string, err error) {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return
	}
	c.m.errors.WithLabelValues(op).Inc()
	c.setUp(false, err)
}

// setUp changes the state, logging and counting the change once.
func (c *Cluster) setUp(up bool, err error) {
	c.downMu.Lock()
	defer c.downMu.Unlock()
	if c.up.Load() == up {
		return
	}
	c.up.Store(up)
	if up {
		c.m.up.Set(1)
		c.logger.Info("cluster state in Redis answers: limits, sessions and load are the fleet's", "redis", c.cfg.Redis.Address, "replica", c.id)
		return
	}
	c.m.up.Set(0)
	c.m.replicas.Set(0)
	c.clearPeers()
	c.logger.Warn("cluster state in Redis does not answer: this replica goes on alone (its own limits, sessions and load) until it does",
		"redis", c.cfg.Redis.Address, "err", err, "limits_when_down", c.cfg.LimitsWhenDown)
}

// Run keeps the replica in the fleet until ctx ends: it pings Redis until
// it answers, publishes and reads the load (cluster.share_load), writes
// the queued writes, and after a failure pings again every 500ms. It
// returns when ctx is done, after closing the connection.
func (c *Cluster) Run(ctx context.Context) {
	defer c.rdb.Close()
	var wg sync.WaitGroup
	wg.Go(func() { c.writer(ctx) })
	defer wg.Wait()
	c.ping(ctx)
	if !c.up.Load() {
		// setUp logs only changes; the first state is news too.
		c.logger.Warn("cluster state in Redis does not answer yet: this replica goes on alone until it does", "redis", c.cfg.Redis.Address)
	}
	every := rejoinEvery
	if c.cfg.ShareLoad {
		every = min(every, c.cfg.PublishInterval)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastPing := time.Now()
	for {
		select {
		case <-ctx.Done():
			c.retire()
			return
		case <-tick.C:
		}
		if c.up.Load() && c.cfg.ShareLoad {
			c.shareLoad(ctx) // its calls tell whether Redis answers
			continue
		}
		if !c.up.Load() {
			// A request that found Redis down cleared the peers' load,
			// but a publish under way then may have set it again.
			c.clearPeers()
		}
		if time.Since(lastPing) >= rejoinEvery {
			lastPing = time.Now()
			c.ping(ctx)
		}
	}
}

// ping asks Redis whether it answers and sets the state by the answer.
func (c *Cluster) ping(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, c.cfg.Redis.Timeout)
	defer cancel()
	if err := c.rdb.Ping(pctx).Err(); err != nil {
		if ctx.Err() == nil && c.up.Load() {
			c.m.errors.WithLabelValues(opPing).Inc()
		}
		c.setUp(false, err)
		return
	}
	c.setUp(true, nil)
}

// enqueue queues w for the writer; it is dropped while the state is down
// or the queue is full.
func (c *Cluster) enqueue(w write) bool {
	if !c.up.Load() {
		c.m.dropped.WithLabelValues(w.op).Inc()
		return false
	}
	select {
	case c.writes <- w:
		return true
	default:
		c.m.dropped.WithLabelValues(w.op).Inc()
		return false
	}
}

// maxBatch is the most writes one pipeline carries.
const maxBatch = 128

// writer sends the queued writes, as many as are waiting in one pipeline.
func (c *Cluster) writer(ctx context.Context) {
	batch := make([]write, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case w := <-c.writes:
			batch = append(batch, w)
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case w := <-c.writes:
				batch = append(batch, w)
			default:
				break fill
			}
		}
		if !c.up.Load() {
			for _, w := range batch {
				c.m.dropped.WithLabelValues(w.op).Inc()
			}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, c.cfg.Redis.Timeout)
		pipe := c.rdb.Pipeline()
		for _, w := range batch {
			if w.eval != nil {
				w.eval.Run(wctx, pipe, w.keys, w.args...)
			} else {
				pipe.Do(wctx, w.args...)
			}
		}
		cmds, err := pipe.Exec(wctx)
		cancel()
		if err != nil && !isScriptMiss(err) {
			c.failed(ctx, batch[0].op, err)
			continue
		}
		// A script the server no longer has (it restarted) is loaded by
		// the next request-path call; the writes that missed it are sent
		// again once, by EVAL.
		for i, cmd := range cmds {
			if isScriptMiss(cmd.Err()) && batch[i].eval != nil {
				wctx, cancel := context.WithTimeout(ctx, c.cfg.Redis.Timeout)
				if err := batch[i].eval.Eval(wctx, c.rdb, batch[i].keys, batch[i].args...).Err(); err != nil {
					c.failed(ctx, batch[i].op, err)
				}
				cancel()
			}
		}
	}
}

// isScriptMiss reports a NOSCRIPT error: EVALSHA of a script the server
// does not hold.
func isScriptMiss(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
