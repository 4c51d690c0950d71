package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// PDConfig makes a [Server] one side of a disaggregated prefill/decode
// (P/D) pair, speaking vLLM's protocol (kv_transfer_params, as
// NixlConnector does) or, for engine sglang, SGLang's bootstrap rooms.
type PDConfig struct {
	// Role is prefill, decode or both; "" is both. A prefill server
	// answers vLLM prefill legs with the kv_transfer_params a decoder
	// needs; a decode server given them pays a KV transfer instead of the
	// prompt's prefill. Any role serves requests that carry no P/D fields
	// as before.
	Role string
	// Rooms is the bootstrap registry SGLang servers of one process meet
	// in: a decode leg waits there for the prefill leg of its
	// bootstrap_room. Nil makes SGLang decode legs start at once.
	Rooms *Rooms
	// KVBytesPerToken is the KV cache one prompt token moves: 2 (K and V)
	// x layers x KV heads x head size x bytes per value; Llama-3.1-8B in
	// bf16 is 2x32x8x128x2 = 131072. (default 131072)
	KVBytesPerToken int
	// TransferBandwidth is the prefill-to-decode KV bandwidth in bytes a
	// second. An assumption, not a measurement: 25e9, one 200 Gb/s RDMA
	// link. (default 25e9)
	TransferBandwidth float64
	// TransferSetup is the fixed cost of one request's transfer (the
	// connector's handshake and block metadata). An assumption. (default 2ms)
	TransferSetup time.Duration
	// RoomTimeout bounds a SGLang decode leg's wait for its prefill.
	// (default 30s)
	RoomTimeout time.Duration
}

func (c *PDConfig) setDefaults() {
	if c.KVBytesPerToken <= 0 {
		c.KVBytesPerToken = 131072
	}
	if c.TransferBandwidth <= 0 {
		c.TransferBandwidth = 25e9
	}
	if c.TransferSetup <= 0 {
		c.TransferSetup = 2 * time.Millisecond
	}
	if c.RoomTimeout <= 0 {
		c.RoomTimeout = 30 * time.Second
	}
}

// TransferTime is how long moving the KV cache of a prompt of tokens
// tokens from its prefill server to its decode server takes: the setup,
// then its bytes over the bandwidth. Zero fields take their defaults.
func (c PDConfig) TransferTime(tokens int) time.Duration {
	c.setDefaults()
	return c.TransferSetup + time.Duration(float64(tokens)*float64(c.KVBytesPerToken)/c.TransferBandwidth*float64(time.Second))
}

// checkRole refuses a role that is none of the three.
func checkRole(role string) error {
	switch role {
	case "", "both", "prefill", "decode":
		return nil
	}
	return fmt.Errorf("sim: unknown role %q (known: prefill, decode, both)", role)
}

// Rooms is SGLang's bootstrap meeting point, in process: each room is
// opened by its prefill leg and closed when that leg ends, done or
// failed. It is safe for concurrent use.
type Rooms struct {
	mu    sync.Mutex
	rooms map[uint64]*room
}

type room struct {
	done chan struct{} // closed when the prefill leg ended
	ok   bool          // written before done is closed
}

// NewRooms returns an empty registry.
func NewRooms() *Rooms { return &Rooms{rooms: map[uint64]*room{}} }

func (rs *Rooms) get(id uint64) *room {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.rooms[id]
	if !ok {
		r = &room{done: make(chan struct{})}
		rs.rooms[id] = r
	}
	return r
}

// end records the prefill leg of room id as ended, ok or not. A room
// whose decode leg already met it is forgotten.
func (rs *Rooms) end(id uint64, ok bool) {
	r := rs.get(id)
	r.ok = ok
	close(r.done)
}

// wait blocks until room id's prefill leg ends, ctx ends or timeout
// passes, and reports whether the KV cache arrived.
func (rs *Rooms) wait(ctx context.Context, id uint64, timeout time.Duration) error {
	r := rs.get(id)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		rs.mu.Lock()
		delete(rs.rooms, id)
		rs.mu.Unlock()
		if !r.ok {
			return fmt.Errorf("bootstrap room %d: the prefill failed", id)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("bootstrap room %d: no prefill within %s", id, timeout)
	}
}

// pdFields are the P/D fields of a generation request.
type pdFields struct {
	KV *struct {
		DoRemoteDecode  bool `json:"do_remote_decode"`
		DoRemotePrefill bool `json:"do_remote_prefill"`
	} `json:"kv_transfer_params"`
	BootstrapRoom *uint64 `json:"bootstrap_room"`
}

// transferredKey marks a request context whose prompt's KV cache came
// from a prefill server: the model prefills nothing but the last token.
type transferredKey struct{}

// transferred reports whether ctx is a decode leg's whose KV was moved.
func transferred(ctx context.Context) bool { return ctx.Value(transferredKey{}) != nil }

// disaggregated wraps a generation route with the server's P/D protocol.
// vLLM: a prefill leg (do_remote_decode) runs as is, its answer given the
// kv_transfer_params a decoder needs; a decode leg (do_remote_prefill)
// waits out the KV transfer, then runs without the prefill. SGLang: a
// prefill leg opens its room when it ends; a decode leg waits for it,
// and fails when the prefill did, its request was aborted, or
// RoomTimeout passed; a request without a room is refused, as SGLang's
// disaggregated servers refuse it.
func (s *Server) disaggregated(next http.HandlerFunc) http.HandlerFunc {
	cfg := s.cfg.PD
	if cfg.Role == "" || cfg.Role == "both" && cfg.Rooms == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			vllmError(w, http.StatusBadRequest, "BadRequestError", "", "Invalid request body: "+err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var f pdFields
		_ = json.Unmarshal(body, &f) // generate reports a bad body
		switch {
		case f.BootstrapRoom == nil && s.cfg.Engine == "sglang" && cfg.Role != "both":
			// SGLang's servers in a disaggregation mode take no request
			// without a room (the message as volcano-sh/kthena #865
			// quotes it).
			vllmError(w, http.StatusBadRequest, "BadRequestError", "", "Invalid request: Disaggregated request received without bootstrap room id.")
		case f.BootstrapRoom != nil && cfg.Rooms != nil && cfg.Role != "decode":
			rec := &prefillAnswer{header: http.Header{}, status: http.StatusOK}
			next(rec, r)
			cfg.Rooms.end(*f.BootstrapRoom, rec.status == http.StatusOK)
			rec.send(w)
		case f.BootstrapRoom != nil && cfg.Rooms != nil:
			if err := cfg.Rooms.wait(r.Context(), *f.BootstrapRoom, cfg.RoomTimeout); err != nil {
				if r.Context().Err() == nil {
					vllmError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "", err.Error())
				}
				return
			}
			if !s.transfer(r, body) {
				return
			}
			next(w, r.WithContext(context.WithValue(r.Context(), transferredKey{}, true)))
		case f.KV != nil && f.KV.DoRemoteDecode && cfg.Role != "decode":
			rec := &prefillAnswer{header: http.Header{}, status: http.StatusOK}
			next(rec, r)
			if rec.status == http.StatusOK {
				rec.addKV(s.kvParams(r, body))
			}
			rec.send(w)
		case f.KV != nil && f.KV.DoRemotePrefill && cfg.Role != "prefill":
			if !s.transfer(r, body) {
				return
			}
			next(w, r.WithContext(context.WithValue(r.Context(), transferredKey{}, true)))
		default:
			next(w, r)
		}
	}
}

// transfer waits out the KV transfer of the request's prompt
// ([PDConfig.TransferTime]). It reports false if the client left.
func (s *Server) transfer(r *http.Request, body []byte) bool {
	d := s.cfg.PD.TransferTime(promptTokens(body)) // the body bounds the prompt; close enough for a cost
	if m, ok := s.ranks[0].(interface{ timeScale() float64 }); ok && m.timeScale() > 0 {
		d = time.Duration(float64(d) / m.timeScale()) // the model's --speed applies to the transfer too
	}
	return sleepCtx(r.Context(), d) == nil
}

// timeScale is how many times faster than real time the model runs.
func (l *Live) timeScale() float64 { return l.speed }

// timeScale is how many times faster than real time the model runs.
func (m *Steady) timeScale() float64 { return m.cfg.Speed }

// kvParams are the kv_transfer_params a vLLM prefill server returns for
// its decoder: where the blocks are and which, do_remote_prefill set.
func (s *Server) kvParams(r *http.Request, body []byte) json.RawMessage {
	blocks := max(1, ceilDiv(promptTokens(body), 16))
	ids := make([]int, blocks)
	base := int(s.seq.Load()) * blocks
	for i := range ids {
		ids[i] = base + i
	}
	host, port := r.Host, 0
	if h, p, ok := cutPort(r.Host); ok {
		host, port = h, p
	}
	v, _ := json.Marshal(map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_engine_id": fmt.Sprintf("sim-%s-%d", s.cfg.Model, s.created), "remote_block_ids": ids,
		"remote_host": host, "remote_port": port, "tp_size": 1,
	})
	return v
}

func cutPort(hostport string) (string, int, bool) {
	i := bytes.LastIndexByte([]byte(hostport), ':')
	if i < 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(hostport[i+1:])
	return hostport[:i], p, err == nil
}

// prefillAnswer holds a prefill leg's answer to add kv_transfer_params
// to it: the leg is not streamed (stream false), so nothing is lost by
// holding it.
type prefillAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *prefillAnswer) Header() http.Header         { return a.header }
func (a *prefillAnswer) Write(b []byte) (int, error) { return a.body.Write(b) }
func (a *prefillAnswer) WriteHeader(code int)        { a.status = code }

// addKV adds kv_transfer_params to a JSON answer.
func (a *prefillAnswer) addKV(kv json.RawMessage) {
	var m map[string]json.RawMessage
	if json.Unmarshal(a.body.Bytes(), &m) != nil {
		return // a stream or an error: passed on as it is
	}
	m["kv_transfer_params"] = kv
	b, _ := json.Marshal(m)
	a.body.Reset()
	a.body.Write(b)
}

func (a *prefillAnswer) send(w http.ResponseWriter) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body.Bytes())
}

// Receive enters the blocks a KV transfer brought into the prefix cache,
// as free blocks holding content, so that the request they came for hits
// them and prefills only its last token, as a vLLM decode server fills
// the blocks NixlConnector pulled. Blocks already cached are kept; it
// stops when the free blocks are used up, evicting older content as any
// allocation does but never the transfer's own.
func (e *Engine) Receive(hashes []uint64) {
	if e.cfg.NoPrefixCaching {
		return
	}
	room := e.nfree // each block received goes back on the free list: count them out
	for _, h := range hashes {
		if _, ok := e.cache[h]; ok {
			continue
		}
		if room == 0 {
			return
		}
		room--
		b := e.allocate()
		e.ref[b] = 0
		e.hash[b], e.hasHash[b] = h, true
		e.cache[h] = b
		e.pushTail(b)
	}
}
