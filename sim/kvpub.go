package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// KVPublisher publishes an engine's KV events as vLLM does when started
// with --kv-events-config (vllm/distributed/kv_events.py,
// ZmqEventPublisher): a PUB socket sends [topic, sequence number as 8
// big-endian bytes, msgpack batch], and a ROUTER socket answers a replay
// request [start sequence] with every buffered batch from there, each as
// [sequence, batch], then [-1, ""]. Batches are encoded as current vLLM
// encodes them (msgspec structs as maps, the event type under "type").
// Its methods may be called concurrently.
type KVPublisher struct {
	pub, replay zmq4.Socket
	blockSize   int

	mu     sync.Mutex
	seq    uint64    // guarded by mu: the next batch's number
	buffer []kvBatch // guarded by mu: the last kvReplayBatches batches
}

type kvBatch struct {
	seq     uint64
	payload []byte
}

// kvReplayBatches is how many batches a publisher keeps for replay
// (vLLM's buffer_steps default is 10,000).
const kvReplayBatches = 10_000

// NewKVPublisher listens on pubAddr and, unless it is "", replayAddr
// (host:port; port 0 picks one) until ctx ends.
func NewKVPublisher(ctx context.Context, pubAddr, replayAddr string, blockSize int) (*KVPublisher, error) {
	p := &KVPublisher{pub: zmq4.NewPub(ctx), blockSize: blockSize}
	if err := p.pub.Listen("tcp://" + pubAddr); err != nil {
		return nil, fmt.Errorf("sim: kv events: %w", err)
	}
	if replayAddr != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen("tcp://" + replayAddr); err != nil {
			p.pub.Close()
			return nil, fmt.Errorf("sim: kv events replay: %w", err)
		}
		go p.serveReplay()
	}
	go func() {
		<-ctx.Done()
		p.Close()
	}()
	return p, nil
}

// Endpoint is the PUB socket's address, as "tcp://host:port".
func (p *KVPublisher) Endpoint() string { return "tcp://" + p.pub.Addr().String() }

// ReplayEndpoint is the ROUTER socket's address, "" without one.
func (p *KVPublisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return "tcp://" + p.replay.Addr().String()
}

// Published returns how many batches have been published: the next
// batch's sequence number.
func (p *KVPublisher) Published() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Close stops publishing.
func (p *KVPublisher) Close() {
	p.pub.Close()
	if p.replay != nil {
		p.replay.Close()
	}
}

// Publish sends events as one batch, as vLLM sends one per engine step;
// no events sends nothing.
func (p *KVPublisher) Publish(events []KVEvent) error {
	if len(events) == 0 {
		return nil
	}
	payload := EncodeKVBatch(nil, float64(time.Now().UnixNano())/1e9, events, p.blockSize)
	p.mu.Lock()
	seq := p.seq
	p.seq++
	if len(p.buffer) == kvReplayBatches {
		p.buffer = append(p.buffer[:0], p.buffer[1:]...)
	}
	p.buffer = append(p.buffer, kvBatch{seq, payload})
	var num [8]byte
	binary.BigEndian.PutUint64(num[:], seq)
	// Sent under the lock so that batches leave in their numbers' order.
	err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte{}, num[:], payload))
	p.mu.Unlock()
	return err
}

func (p *KVPublisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return
		}
		// [identity, "", start]
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		batches := make([]kvBatch, 0, len(p.buffer))
		for _, b := range p.buffer {
			if b.seq >= start {
				batches = append(batches, b)
			}
		}
		p.mu.Unlock()
		var num [8]byte
		for _, b := range batches {
			binary.BigEndian.PutUint64(num[:], b.seq)
			if p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, num[:], b.payload)) != nil {
				return
			}
		}
		binary.BigEndian.PutUint64(num[:], math.MaxUint64)
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, num[:], []byte{}))
	}
}

// EncodeKVBatch appends to dst one msgpack KVEventBatch of events, as
// current vLLM encodes it: {"ts", "events", "data_parallel_rank"}, each
// event a map with its type under "type". Consecutive stored blocks of one
// chain share one BlockStored event, as one request's blocks do in vLLM.
func EncodeKVBatch(dst []byte, ts float64, events []KVEvent, blockSize int) []byte {
	// Group first: the events array's length comes before its items.
	type group struct{ from, to int }
	var groups []group
	for i, e := range events {
		if n := len(groups); n > 0 {
			g := &groups[n-1]
			last := events[g.to-1]
			if !e.Stored && !last.Stored || e.Stored && e.HasParent && last.Stored && last.Hash == e.Parent && last.Adapter == e.Adapter {
				g.to = i + 1
				continue
			}
		}
		groups = append(groups, group{i, i + 1})
	}
	dst = mpMap(dst, 3)
	dst = mpStr(dst, "ts")
	dst = append(dst, 0xcb)
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(ts))
	dst = mpStr(dst, "events")
	dst = mpArray(dst, len(groups))
	for _, g := range groups {
		first := events[g.from]
		// Both types start {"type": T, "block_hashes": [...], ...}.
		typ, fields := "BlockStored", 8
		if !first.Stored {
			typ, fields = "BlockRemoved", 3
		}
		dst = mpMap(dst, fields)
		dst = mpStr(dst, "type")
		dst = mpStr(dst, typ)
		dst = mpStr(dst, "block_hashes")
		dst = mpArray(dst, g.to-g.from)
		for _, e := range events[g.from:g.to] {
			dst = mpUint(dst, e.Hash)
		}
		if !first.Stored {
			dst = mpStr(dst, "medium")
			dst = mpStr(dst, "GPU")
			continue
		}
		dst = mpStr(dst, "parent_block_hash")
		if first.HasParent {
			dst = mpUint(dst, first.Parent)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = mpStr(dst, "token_ids")
		dst = mpArray(dst, (g.to-g.from)*blockSize)
		for _, e := range events[g.from:g.to] {
			for _, t := range e.Tokens {
				dst = mpUint(dst, uint64(t))
			}
		}
		dst = mpStr(dst, "block_size")
		dst = mpUint(dst, uint64(blockSize))
		dst = mpStr(dst, "lora_id")
		dst = append(dst, 0xc0)
		dst = mpStr(dst, "medium")
		dst = mpStr(dst, "GPU")
		dst = mpStr(dst, "lora_name")
		if first.Adapter != "" {
			dst = mpStr(dst, first.Adapter)
		} else {
			dst = append(dst, 0xc0)
		}
	}
	dst = mpStr(dst, "data_parallel_rank")
	return mpUint(dst, 0)
}

func mpMap(dst []byte, n int) []byte {
	if n < 16 {
		return append(dst, 0x80|byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

func mpArray(dst []byte, n int) []byte {
	if n < 16 {
		return append(dst, 0x90|byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func mpStr(dst []byte, s string) []byte {
	if len(s) < 32 {
		dst = append(dst, 0xa0|byte(len(s)))
	} else {
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(len(s)))
	}
	return append(dst, s...)
}

func mpUint(dst []byte, v uint64) []byte {
	if v < 128 {
		return append(dst, byte(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}
