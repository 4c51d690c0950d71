package balancer

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	lru "github.com/hashicorp/golang-lru/v2"
)

// ErrNoBackend is returned by [Balancer.Pick] when no backend can take the
// request: the model is served, or may be, but no backend that serves it is
// up.
var ErrNoBackend = errors.New("no backend available")

// ErrUnknownModel is returned by [Balancer.Pick] when the requested model
// has never been offered by any backend and every backend's model list is
// known, so none may offer it. A model that was offered once and whose
// backends are now down or gone is [ErrNoBackend] instead: clients treat a
// 404 as final (issue 18).
var ErrUnknownModel = errors.New("unknown model")

// PrefixIndex is what the balancer needs of an approximate prefix-cache
// index (prefix.Index): hash a prompt into blocks, tell how many leading
// blocks each backend slot holds, and remember what was sent where.
type PrefixIndex interface {
	AppendHashes(dst []uint64, seed uint64, prompt []byte) []uint64
	// HashShape is how AppendHashes cuts a prompt, for a prompt in parts
	// ([PromptParts]): block size in bytes, most blocks, and whether a
	// partial last block is hashed.
	HashShape() (blockBytes, maxBlocks int, partial bool)
	Match(hashes []uint64, dst []int32) int
	Insert(slot int, hashes []uint64)
	// Resize sizes slot from the backend's KV capacity at bytesPerToken
	// canonical bytes a token (0: the index's default).
	Resize(slot, blockTokens, numBlocks int, bytesPerToken float64)
	// Evicted tells whether slot dropped block h recently and has not
	// placed it again.
	Evicted(slot int, h uint64) bool
	Forget(slot int)
	// Held tells how many blocks the index remembers for slot.
	Held(slot int) int
}

// TextTree is a character prefix tree shared by backend slots
// (prefix.Tree), for the presets that match prompt text ([Preset.Tree]).
type TextTree interface {
	Match(text []byte, dst []int32) int
	Insert(slot int, text []byte)
	Size(slot int) int
	Forget(slot int)
}

// Oracle tells the prompt tokens a backend really holds in its prefix cache
// for a request. Only a simulator knows; the presets with
// [Preset.TrueCache] match prompts with it instead of an index.
type Oracle interface {
	CachedTokens(be *Backend, req *Request) int
}

// CacheEvents tells the prompt tokens a backend's prefix cache holds for a
// request as the engine's own KV-cache events report it (kvevents.Store).
// ok is false when the backend sends no events or the request carries no
// [Request.TokenBlocks]; the approximate index then stands. It is called
// during picks, concurrently, and must not block on I/O.
type CacheEvents interface {
	Held(be *Backend, req *Request) (tokens int, ok bool)
	// Prefilling tells the prefills the backend's events showed in
	// progress at the last step they reported; ok is false before any.
	// They include what other balancers sent it, which this one's ledger
	// cannot see.
	Prefilling(be *Backend) (p Prefills, ok bool)
}

// Prefills are the prefills a backend's KV events showed in progress at
// one step.
type Prefills struct {
	Sequences int       // sequences prefilling
	Done      int       // prompt tokens they had prefilled, together
	Step      int       // of those, the tokens the step prefilled
	At        time.Time // when the step was reported
}

// Deps are what a Balancer is built with besides its Config.
type Deps struct {
	// Index is the approximate prefix index of the presets that have one
	// ([Preset.Index]), cut and sized as the preset's [IndexSpec] says.
	// Nil disables prefix matching.
	Index PrefixIndex
	// Tree serves the presets that match prompt text ([Preset.Tree]),
	// which require it.
	Tree TextTree
	// Oracle serves the presets with [Preset.TrueCache], which require it
	// and which only the simulator can run; nil otherwise.
	Oracle Oracle
	// Events, when set, is read by the presets that use llmlb's own
	// prefix index (the default) beside that index: a backend's match is
	// the longer of the two. Nil reads none.
	Events CacheEvents
	// Rand returns uniformly random numbers and must be safe for
	// concurrent use. Nil uses math/rand/v2.
	Rand func() uint64
	// Now tells the time. Nil uses time.Now.
	Now func() time.Time
}

// Spec is what a writer knows about one backend: its identity and what it
// serves. [Balancer.Update] turns specs into snapshot entries.
type Spec struct {
	ID       string
	Name     string // what clients may see (Backend.Name); "" gives the next b<N>
	URL      *url.URL
	Engine   string
	Models   []string // nil: not known yet
	Adapters []Adapter
	State    State
	Reason   string            // why State, for /debug/backends
	Warning  string            // a problem that leaves State alone (see Backend.Warning)
	Labels   map[string]string // from config, for operators (see Backend.Labels)
	Metrics  Metrics           // last good reading; zero At before the first
	Stale    bool              // Metrics is too old to trust
	// Ranked and Rank: see Backend.Ranked. A ranked spec with no Name is
	// named after its server: the server's default name and /r<Rank>.
	Ranked bool
	Rank   int
	Role   Role // prefill, decode or both (see Backend.Role)
	// BootstrapPort is the SGLang prefill server's bootstrap port
	// (Backend.BootstrapPort); 0 for none.
	BootstrapPort int
}

// Snapshot is an immutable view of every backend. Readers may use it from any
// goroutine without locking.
type Snapshot struct {
	// Backends are sorted by ID.
	Backends []*Backend
	// Built is when the snapshot was published.
	Built time.Time

	gen   uint64 // changes when the set of backend IDs changes
	slots int    // highest slot in use plus one
	// offered holds every model and adapter name a backend has offered
	// since the balancer started, configured or learned. Shared between
	// snapshots until a new name arrives; never written once published.
	offered map[string]struct{}
}

// Offered reports whether any backend has offered model, as a base model or
// an adapter, since the balancer started, even if none offers it now.
func (s *Snapshot) Offered(model string) bool {
	_, ok := s.offered[model]
	return ok
}

// Balancer publishes snapshots and picks backends. Pick, PickWait, Explain
// and Snapshot may be called concurrently from any goroutine; Pick never
// blocks on I/O or on writers (picks that attach a guard take turns for
// their microseconds, so each sees the ledgers the previous one left).
// Update and Remove calls are serialised by an internal mutex.
type Balancer struct {
	// immutable after New
	cfg      Config
	logger   *slog.Logger
	now      func() time.Time
	rand     func() uint64
	pol      *policy
	adm      *admission
	sessions *lru.Cache[string, string]        // nil when session affinity is off
	routes   atomic.Pointer[map[string]*route] // replaced whole by SetModels
	pool     sync.Pool                         // *scratch

	snap   atomic.Pointer[Snapshot]
	pickMu sync.Mutex // serialises picks that attach a guard

	// passive health (passive.go)
	ejectMu   sync.Mutex // serialises ejections, so that two cannot both pass the cap
	ejections [len(ejectReasons)]atomic.Int64
	capped    atomic.Int64
	fleet     fleetTTFT

	mu        sync.Mutex          // serialises writers
	ledgers   map[string]*Ledger  // guarded by mu; by backend ID, kept while the backend exists
	current   map[string]*Backend // guarded by mu; the published backends by ID
	slots     map[string]int      // guarded by mu
	freeSlots []int               // guarded by mu
	nextSlot  int                 // guarded by mu
	names     map[string]string   // guarded by mu; default names by backend ID, kept for the process's life
	gen       uint64              // guarded by mu
	offered   map[string]struct{} // guarded by mu; published in snapshots, replaced (not written) when it grows
}

// New returns a Balancer with an empty snapshot running cfg's policy. A nil
// logger discards. cfg must have passed Validate; the only error is a
// policy that needs a dependency deps lacks.
func New(cfg Config, deps Deps, models []ModelRoute, logger *slog.Logger) (*Balancer, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if deps.Rand == nil {
		deps.Rand = rand.Uint64
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if cfg.MaxCandidates < 1 || cfg.MaxCandidates > CandidateLimit {
		cfg.MaxCandidates = min(max(cfg.MaxCandidates, 1), CandidateLimit)
	}
	b := &Balancer{
		cfg:     cfg,
		logger:  logger,
		now:     deps.Now,
		rand:    deps.Rand,
		ledgers: make(map[string]*Ledger),
		current: make(map[string]*Backend),
		slots:   make(map[string]int),
		names:   make(map[string]string),
	}
	b.SetModels(models)
	pol, err := newPolicy(cfg, deps)
	if err != nil {
		return nil, err
	}
	b.pol = pol
	b.adm = newAdmission(cfg, deps.Rand)
	if cfg.Session.Header != "" {
		b.sessions, _ = lru.New[string, string](cfg.Session.MaxSessions)
	}
	b.pool.New = func() any { return new(scratch) }
	b.snap.Store(&Snapshot{Built: b.now()})
	return b, nil
}

// Config returns the configuration b runs with.
func (b *Balancer) Config() Config { return b.cfg }

// Policy returns the name of the policy b runs.
func (b *Balancer) Policy() string { return b.pol.name }

// UserKeyed reports whether b's policy keys requests on the first user
// message, so callers should fill [Request.UserText].
func (b *Balancer) UserKeyed() bool { return b.pol.userKeyed }

// Snapshot returns the current snapshot. Never nil.
func (b *Balancer) Snapshot() *Snapshot { return b.snap.Load() }

// Update replaces the state of the backends named in specs and publishes a new
// snapshot. Backends not named keep their state. A backend whose state changes
// is logged once. A new metrics reading takes a mark of the backend's
// ledger, so what is sent after it is added to what it says.
func (b *Balancer) Update(specs ...Spec) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	for _, s := range specs {
		old := b.current[s.ID]
		l := b.ledgerLocked(s.ID)
		nb := &Backend{
			ID:            s.ID,
			Name:          s.Name,
			URL:           s.URL,
			Engine:        s.Engine,
			Models:        s.Models,
			Adapters:      s.Adapters,
			State:         s.State,
			Reason:        s.Reason,
			Warning:       s.Warning,
			Labels:        s.Labels,
			Metrics:       s.Metrics,
			Stale:         s.Stale,
			Ranked:        s.Ranked,
			Rank:          s.Rank,
			Role:          s.Role,
			Since:         now,
			BootstrapPort: s.BootstrapPort,
			Ledger:        l,
		}
		switch {
		case nb.Name == "" && s.Ranked:
			nb.Name = b.nameLocked(RankServer(s.ID)) + "/r" + strconv.Itoa(s.Rank)
		case nb.Name == "":
			nb.Name = b.nameLocked(s.ID)
		}
		if old != nil {
			nb.slot, nb.idHash, nb.mark = old.slot, old.idHash, old.mark
			if old.State == s.State {
				nb.Since = old.Since
			}
		} else {
			nb.slot = b.slotLocked(s.ID)
			nb.idHash = xxhash.Sum64String(s.ID)
			b.gen++
		}
		if old == nil || old.State != s.State {
			b.logger.Debug("backend state", "backend", s.ID, "state", s.State.String())
		}
		if old == nil || !s.Metrics.At.Equal(old.Metrics.At) {
			nb.mark = l.mark()
			if !s.Metrics.At.IsZero() {
				l.slots.reading(s.Metrics.Running, s.Metrics.Queued, s.Metrics.KVUsage)
			}
		}
		if b.pol.sizeIndex && (old == nil || old.Metrics.BlockSize != s.Metrics.BlockSize || old.Metrics.NumBlocks != s.Metrics.NumBlocks) {
			b.pol.index.Resize(nb.slot, int(s.Metrics.BlockSize.V), int(s.Metrics.NumBlocks.V), l.tok.scale())
		}
		b.current[s.ID] = nb
		if n := l.slots.own(); old == nil || n != l.slots.lending.Load() {
			l.slots.lending.Store(n)
			b.lendSlotsLocked(nb)
		}
		b.recordOfferedLocked(s)
	}
	b.publishLocked(now)
	b.adm.notify() // new readings may show capacity
}

// lendSlotsLocked lends the most slots any backend of be's class confirmed
// (0: none) to every backend of the class (one engine and KV size, as the ttft
// policy's priors tell them apart): a server that a burst has not yet
// filled runs as many at once as one it has, and learning it only once it
// is full would be one burst late.
func (b *Balancer) lendSlotsLocked(be *Backend) {
	class := classOf(be)
	n := int64(0)
	for _, o := range b.current {
		if classOf(o) == class {
			n = max(n, o.Ledger.slots.own())
		}
	}
	for _, o := range b.current {
		if classOf(o) == class {
			o.Ledger.slots.lent.Store(n)
		}
	}
}

// Ledger returns the ledger of the backend named id, making it if the
// backend has none yet. The same ledger is used by every snapshot entry of
// that backend until it is removed.
func (b *Balancer) Ledger(id string) *Ledger {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ledgerLocked(id)
}

// ledgerLocked is Ledger for callers that hold b.mu.
func (b *Balancer) ledgerLocked(id string) *Ledger {
	l := b.ledgers[id]
	if l == nil {
		l = new(Ledger)
		b.ledgers[id] = l
	}
	return l
}

// nameLocked returns the default name of the backend with this ID: b1,
// b2, ... in the order backends first appear (static backends in config
// order), the same name whenever the ID comes back, never another
// backend's. Caller must hold b.mu.
func (b *Balancer) nameLocked(id string) string {
	if n, ok := b.names[id]; ok {
		return n
	}
	n := "b" + strconv.Itoa(len(b.names)+1)
	b.names[id] = n
	return n
}

// slotLocked returns id's slot, giving a new id the lowest free slot.
// Caller must hold b.mu.
func (b *Balancer) slotLocked(id string) int {
	if s, ok := b.slots[id]; ok {
		return s
	}
	var s int
	if n := len(b.freeSlots); n > 0 {
		slices.Sort(b.freeSlots)
		s, b.freeSlots = b.freeSlots[0], b.freeSlots[1:]
	} else {
		s = b.nextSlot
		b.nextSlot++
	}
	b.slots[id] = s
	return s
}

// Remove drops backends from the set. Requests already in flight to them keep
// their ledger and finish normally. Callers that want in-flight requests to
// drain first mark the backend [StateDraining] and remove it when its
// in-flight count reaches zero. What the prefix index remembers of a
// removed backend is forgotten.
func (b *Balancer) Remove(ids ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if _, ok := b.current[id]; ok {
			b.logger.Info("backend removed", "backend", id)
			b.gen++
		}
		if s, ok := b.slots[id]; ok {
			b.pol.forget(s)
			b.freeSlots = append(b.freeSlots, s)
			delete(b.slots, id)
		}
		delete(b.current, id)
		delete(b.ledgers, id)
	}
	b.publishLocked(b.now())
}

// recordOfferedLocked adds the models and adapters s offers to b.offered,
// copying the set first if it grows, since published snapshots share it.
// Caller must hold b.mu.
func (b *Balancer) recordOfferedLocked(s Spec) {
	grown := false
	add := func(name string) {
		if _, ok := b.offered[name]; ok {
			return
		}
		if !grown {
			b.offered, grown = maps.Clone(b.offered), true
			if b.offered == nil {
				b.offered = make(map[string]struct{})
			}
		}
		b.offered[name] = struct{}{}
	}
	for _, m := range s.Models {
		add(m)
	}
	for _, a := range s.Adapters {
		add(a.Name)
	}
}

// publishLocked builds and swaps in a snapshot of b.current. Caller must hold
// b.mu.
func (b *Balancer) publishLocked(now time.Time) {
	backends := make([]*Backend, 0, len(b.current))
	for _, be := range b.current {
		backends = append(backends, be)
	}
	slices.SortFunc(backends, func(x, y *Backend) int { return strings.Compare(x.ID, y.ID) })
	b.snap.Store(&Snapshot{Backends: backends, Built: now, gen: b.gen, slots: b.nextSlot, offered: b.offered})
}

// errModel wraps a pick error with the model it was for.
func errModel(model string, err error) error { return fmt.Errorf("model %q: %w", model, err) }
