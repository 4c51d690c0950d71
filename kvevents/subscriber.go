package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Subscriber follows one server's event stream into a [Store]. Run it in
// its own goroutine; it returns when its context ends.
type Subscriber struct {
	// ID is the backend's ID in the store.
	ID string
	// Endpoint is the server's PUB socket, as "tcp://host:port" (vLLM's
	// default port is 5557).
	Endpoint string
	// Replay is the server's ROUTER socket for missed batches; "" when it
	// has none, and then lost batches clear the server's table.
	Replay string
	// Topic is the topic subscribed to; "" is every topic (vLLM's
	// default).
	Topic string
	Store *Store
	// Log gets one line per stream event worth an operator's eye (a
	// restart, a gap, a bad payload); nil discards them.
	Log *slog.Logger
	// Retry is the wait between connection attempts (default 1s).
	Retry time.Duration
	// ReplayTimeout bounds one replay (default 2s).
	ReplayTimeout time.Duration
	// OnBatch, if set, is called after each batch is entered, with its
	// number and its events (for metrics); it must not block.
	OnBatch func(seq int64, events int)
	// OnReset, if set, is called when the server's table is forgotten
	// for want of events: "restart", "gap" or "unreadable"; it must not
	// block.
	OnReset func(reason string)
}

// seqEnd is the sequence number that ends a replay (vLLM's END_SEQ, -1).
const seqEnd = ^uint64(0)

// Run subscribes and applies every batch until ctx ends. Batches are
// numbered; when numbers skip, the missed batches are asked of Replay,
// and when they cannot be had the server's table is cleared, since a
// missed removal would leave a block the server no longer holds. A number
// lower than the last means the server restarted: its cache is empty.
// When the subscription starts, the batches still in the server's replay
// buffer are read first.
func (s *Subscriber) Run(ctx context.Context) error {
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	retry := s.Retry
	if retry <= 0 {
		retry = time.Second
	}
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(retry), zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.Dial(s.Endpoint); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("kv events %s: %w", s.Endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, s.Topic); err != nil {
		return fmt.Errorf("kv events %s: %w", s.Endpoint, err)
	}
	st := stream{s: s, log: log, last: -1}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("kv events %s: %w", s.Endpoint, err)
		}
		st.receive(ctx, msg.Frames)
	}
}

// stream is one subscription's position in the server's numbering.
type stream struct {
	s    *Subscriber
	log  *slog.Logger
	last int64 // the last batch applied; -1 before the first
	bad  bool  // a bad payload was logged
}

// receive handles one published message: [topic, sequence, payload].
func (st *stream) receive(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		st.fail(fmt.Errorf("a message of %d frames", len(frames)))
		return
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	switch {
	case seq < 0:
		st.fail(fmt.Errorf("sequence number %d", seq))
		return
	case st.last >= 0 && seq <= st.last:
		st.log.Warn("kv events: the server restarted its numbering; forgetting its cache", "backend", st.s.ID, "seq", seq, "last", st.last)
		st.reset("restart")
		st.last = -1
		fallthrough
	case st.last < 0:
		// A first message: what the replay buffer still holds comes
		// first. Nothing is known yet, so what it lacks leaves no
		// block behind that the server dropped.
		if st.s.Replay != "" && seq > 0 {
			st.replay(ctx, 0, seq)
		}
	case seq > st.last+1:
		if st.s.Replay == "" || !st.replay(ctx, st.last+1, seq) {
			st.log.Warn("kv events: batches lost; forgetting the server's cache", "backend", st.s.ID, "from", st.last+1, "to", seq-1)
			st.reset("gap")
		}
	}
	st.apply(seq, frames[2])
}

// apply decodes and enters one batch.
func (st *stream) apply(seq int64, payload []byte) {
	st.last = seq
	b, err := Decode(payload)
	if err != nil {
		st.fail(err)
		return
	}
	st.s.Store.Apply(st.s.ID, b)
	if st.s.OnBatch != nil {
		st.s.OnBatch(seq, len(b.Events))
	}
}

// fail drops what the server's table holds after a message that could not
// be read: it may have removed blocks.
func (st *stream) fail(err error) {
	if !st.bad {
		st.log.Warn("kv events: unreadable message; forgetting the server's cache (logged once)", "backend", st.s.ID, "err", err)
		st.bad = true
	}
	st.reset("unreadable")
}

// reset forgets the server's table.
func (st *stream) reset(reason string) {
	st.s.Store.Clear(st.s.ID)
	if st.s.OnReset != nil {
		st.s.OnReset(reason)
	}
}

// replay asks for batches from, applies those before until and reports
// whether every one of them came.
func (st *stream) replay(ctx context.Context, from, until int64) bool {
	timeout := st.s.ReplayTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := func() error {
		d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0))
		defer d.Close()
		if err := d.Dial(st.s.Replay); err != nil {
			return err
		}
		var start [8]byte
		binary.BigEndian.PutUint64(start[:], uint64(from))
		if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
			return err
		}
		for {
			msg, err := d.Recv()
			if err != nil {
				return err
			}
			f := msg.Frames
			if len(f) > 0 && len(f[0]) == 0 {
				f = f[1:] // the delimiter a ROUTER sends back to a DEALER
			}
			if len(f) != 2 || len(f[0]) != 8 {
				return fmt.Errorf("a replay message of %d frames", len(f))
			}
			seq := binary.BigEndian.Uint64(f[0])
			if seq == seqEnd {
				return nil
			}
			if int64(seq) < from || int64(seq) >= until || st.last >= 0 && int64(seq) <= st.last {
				continue
			}
			if st.last >= 0 && int64(seq) != st.last+1 {
				return errors.New("the replay buffer no longer holds the missed batches")
			}
			st.apply(int64(seq), f[1])
		}
	}()
	if err != nil {
		st.log.Warn("kv events: replay failed", "backend", st.s.ID, "endpoint", st.s.Replay, "err", err)
		return false
	}
	return st.last == until-1
}
