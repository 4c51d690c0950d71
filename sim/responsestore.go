package sim

import (
	"container/list"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
)

// defaultMaxStoredResponses bounds the store. vLLM keeps every stored
// response for the life of the process; the emulation keeps the newest
// 10,000 so a long bench run does not grow without end, while a
// follow-up, which names a recent response, still finds it.
const defaultMaxStoredResponses = 10000

// responseStore is a server's stored responses, the newest max of them.
// Its methods may be called concurrently.
type responseStore struct {
	max int // immutable

	mu    sync.Mutex
	byID  map[string]*storedResponse // guarded by mu
	order list.List                  // guarded by mu; of *storedResponse, oldest first
}

// storedResponse is one response in the store. Its conversation is held
// as a chain: its own input, its output and the response it follows, so a
// long conversation is stored once and not again in every turn.
type storedResponse struct {
	// immutable once stored
	id     string
	prev   *storedResponse // the response this one follows, or nil
	input  json.RawMessage // this request's input as sent (not its instructions)
	events *eventLog       // a background stream's events; nil for others

	// guarded by the store's mu once stored
	resp   responseObject
	cancel context.CancelFunc // stops the background work; nil when none runs
	elem   *list.Element
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, byID: make(map[string]*storedResponse)}
}

// put stores rec, in place of any response with its id, and drops the
// oldest beyond max.
func (st *responseStore) put(rec *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if old := st.byID[rec.id]; old != nil {
		st.order.Remove(old.elem)
	}
	st.byID[rec.id] = rec
	rec.elem = st.order.PushBack(rec)
	for st.order.Len() > st.max {
		oldest := st.order.Remove(st.order.Front()).(*storedResponse)
		delete(st.byID, oldest.id)
	}
}

// get returns the response stored as id and its event log, if it has one.
// A nil store holds nothing.
func (st *responseStore) get(id string) (responseObject, *eventLog, bool) {
	if st == nil {
		return responseObject{}, nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	rec := st.byID[id]
	if rec == nil {
		return responseObject{}, nil, false
	}
	return rec.resp, rec.events, true
}

// conversation returns the response stored as id and the turns a
// follow-up to it starts with: every input and output of the responses it
// follows and its own, without their system turns, since instructions do
// not carry over to a follow-up (vLLM's construct_input_messages drops
// them too). It returns nil when the store holds no such response.
func (st *responseStore) conversation(id string) (*storedResponse, []turn) {
	if st == nil {
		return nil, nil
	}
	type step struct {
		r       *storedResponse
		outputs []string
	}
	var chain []step // newest first
	st.mu.Lock()
	rec := st.byID[id]
	for r := rec; r != nil; r = r.prev {
		var outputs []string
		for _, m := range r.resp.Output {
			for _, c := range m.Content {
				outputs = append(outputs, c.Text)
			}
		}
		chain = append(chain, step{r, outputs})
	}
	st.mu.Unlock()
	if rec == nil {
		return nil, nil
	}
	var turns []turn
	for _, s := range slices.Backward(chain) {
		input, _, _ := readInput(s.r.input, s.r.id) // it was read when stored
		for _, t := range input {
			if t.role != "system" {
				turns = append(turns, t)
			}
		}
		for _, text := range s.outputs {
			turns = append(turns, turn{role: "assistant", text: text})
		}
	}
	return rec, turns
}

// finish records the final response of background work, unless the
// response was cancelled meanwhile.
func (st *responseStore) finish(rec *storedResponse, final responseObject) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if rec.resp.Status != statusCancelled {
		rec.resp = final
	}
	rec.cancel = nil
}

// fail marks background work that ended without an answer failed, unless
// it was cancelled or had finished.
func (st *responseStore) fail(rec *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if rec.resp.Status == statusQueued || rec.resp.Status == statusInProgress {
		rec.resp.Status = statusFailed
	}
	rec.cancel = nil
}

// cancel cancels the queued or running background response id and stops
// its work. Anything else is refused as vLLM refuses it.
func (st *responseStore) cancel(id string) (responseObject, *refusal) {
	if st == nil {
		return responseObject{}, responseNotFound(id)
	}
	st.mu.Lock()
	rec := st.byID[id]
	if rec == nil {
		st.mu.Unlock()
		return responseObject{}, responseNotFound(id)
	}
	if rec.resp.Status != statusQueued && rec.resp.Status != statusInProgress {
		st.mu.Unlock()
		return responseObject{}, &refusal{status: http.StatusBadRequest, typ: "invalid_request_error", param: "response_id",
			msg: "Cannot cancel a synchronous response."}
	}
	rec.resp.Status = statusCancelled
	stop := rec.cancel
	rec.cancel = nil
	resp := rec.resp
	st.mu.Unlock()
	if stop != nil {
		stop()
	}
	return resp, nil
}

// remove deletes the response id, stopping any background work, and
// reports whether the store held it.
func (st *responseStore) remove(id string) bool {
	if st == nil {
		return false
	}
	st.mu.Lock()
	rec := st.byID[id]
	if rec == nil {
		st.mu.Unlock()
		return false
	}
	delete(st.byID, id)
	st.order.Remove(rec.elem)
	stop := rec.cancel
	rec.cancel = nil
	st.mu.Unlock()
	if stop != nil {
		stop()
	}
	return true
}

// input returns the input of the response id as sent.
func (st *responseStore) input(id string) (json.RawMessage, bool) {
	if st == nil {
		return nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	rec := st.byID[id]
	if rec == nil {
		return nil, false
	}
	return rec.input, true
}

// eventLog is a background stream's events, kept so the request that
// started it and any GET with stream=true can replay them and follow new
// ones. Its methods may be called concurrently.
type eventLog struct {
	mu     sync.Mutex
	frames [][]byte      // guarded by mu; whole SSE frames, frames[i] numbered i
	done   bool          // guarded by mu
	wake   chan struct{} // guarded by mu; closed, and replaced, at each change
}

func newEventLog() *eventLog { return &eventLog{wake: make(chan struct{})} }

func (l *eventLog) add(frame []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frames = append(l.frames, frame)
	close(l.wake)
	l.wake = make(chan struct{})
}

// close marks the log ended: followers stop once they have read it all.
func (l *eventLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	close(l.wake)
	l.wake = make(chan struct{})
}

// read returns the frames from i on, whether the log has ended, and a
// channel closed at its next change.
func (l *eventLog) read(i int) ([][]byte, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frames[min(i, len(l.frames)):], l.done, l.wake
}

// followEvents streams l's events from number from on until the log ends
// or the client leaves.
func followEvents(w http.ResponseWriter, r *http.Request, l *eventLog, from int) {
	sse := startSSE(w, nil)
	for {
		frames, done, wake := l.read(from)
		for _, f := range frames {
			if sse.write(f) != nil {
				return
			}
		}
		from += len(frames)
		if done && len(frames) == 0 {
			return
		}
		if !done {
			select {
			case <-wake:
			case <-r.Context().Done():
				return
			}
		}
	}
}
