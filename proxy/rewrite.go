package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// setModel returns body with every top-level "model" value replaced by
// model and every other byte as it was: the request is forwarded as the
// client wrote it, with only the model name changed (no re-encoding, so
// field order, number spelling and unknown fields survive).
func setModel(body []byte, model string) ([]byte, error) {
	val, _ := json.Marshal(model)
	out, found, err := setField(body, "model", val)
	if err == nil && !found {
		err = errors.New("request body has no model")
	}
	return out, err
}

// withUsage returns body asking for the stream's final usage chunk:
// stream_options.include_usage true, the client's other stream options
// kept, every other byte as it was. opts is the body's stream_options
// value, nil when it has none; body must be a JSON object (ParseRequest
// checked it). When the body has no stream_options, the usual case, the
// field is added at its end as a tail, and the body (a long prompt) is
// not copied.
func withUsage(body []byte, opts json.RawMessage) (sendBody, error) {
	if opts == nil { // no stream_options: append it without walking the body
		end := bytes.LastIndexByte(body, '}')
		if end < 0 || !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
			return sendBody{}, errors.New("request body is not a JSON object")
		}
		const add = `"stream_options":{"include_usage":true}`
		tail := make([]byte, 0, len(add)+1+len(body)-end)
		if bytes.IndexByte(bytes.TrimSpace(body[:end]), ':') >= 0 { // the object has fields
			tail = append(tail, ',')
		}
		tail = append(tail, add...)
		return sendBody{head: body[:end], tail: append(tail, body[end:]...)}, nil
	}
	m := map[string]json.RawMessage{}
	if !isNull(opts) {
		if err := json.Unmarshal(opts, &m); err != nil {
			return sendBody{}, err
		}
	}
	m["include_usage"] = json.RawMessage("true")
	val, _ := json.Marshal(m)
	out, _, err := setField(body, "stream_options", val)
	return sendBody{head: out}, err
}

// setField returns body with every top-level value of key replaced by val,
// or, when key is absent, with key: val added at the end of the object;
// found tells which.
func setField(body []byte, key string, val []byte) (out []byte, found bool, err error) {
	d := json.NewDecoder(bytes.NewReader(body))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, false, errors.New("request body is not a JSON object")
	}
	type span struct{ start, end int64 }
	var spans []span
	fields := 0
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, false, err
		}
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return nil, false, err
		}
		fields++
		if k, _ := t.(string); k == key {
			end := d.InputOffset()
			spans = append(spans, span{end - int64(len(raw)), end})
		}
	}
	if _, err := d.Token(); err != nil { // the closing brace
		return nil, false, err
	}
	if len(spans) == 0 {
		closing := d.InputOffset() - 1
		out = make([]byte, 0, len(body)+len(key)+len(val)+4)
		out = append(out, body[:closing]...)
		if fields > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(key)
		out = append(append(append(out, k...), ':'), val...)
		return append(out, body[closing:]...), false, nil
	}
	out = make([]byte, 0, len(body)+len(val))
	prev := int64(0)
	for _, s := range spans {
		out = append(out, body[prev:s.start]...)
		out = append(out, val...)
		prev = s.end
	}
	return append(out, body[prev:]...), true, nil
}

// maxRewriteLine bounds what lineRewriter holds back looking for a line
// end; a longer line passes through unchanged.
const maxRewriteLine = 64 << 20

// lineRewriter edits a response body, JSON or SSE, as it streams: it
// passes on whole lines (an SSE event's data line is one line), holding
// back only a partial last line, each run of whole lines through edit.
type lineRewriter struct {
	src   io.ReadCloser
	edit  func(dst, seg []byte) []byte // appends seg, edited, to dst
	chunk []byte                       // read buffer, reused
	buf   []byte                       // read, not yet returned
	out   []byte                       // edited, not yet returned
	eof   bool
}

func newLineRewriter(src io.ReadCloser, edit func(dst, seg []byte) []byte) *lineRewriter {
	return &lineRewriter{src: src, edit: edit, chunk: make([]byte, 32<<10)}
}

// modelEdit turns the target model's name back into the name the client
// asked for: `"model":"target"`, with or without a space after the colon.
func modelEdit(target, public string) func(dst, seg []byte) []byte {
	t, _ := json.Marshal(target)
	p, _ := json.Marshal(public)
	var from, to [2][]byte
	for i, sep := range []string{`"model":`, `"model": `} {
		from[i] = append([]byte(sep), t...)
		to[i] = append([]byte(sep), p...)
	}
	return func(dst, seg []byte) []byte {
		for i := range from {
			if bytes.Contains(seg, from[i]) {
				seg = bytes.ReplaceAll(seg, from[i], to[i])
			}
		}
		return append(dst, seg...)
	}
}

func (m *lineRewriter) Read(p []byte) (int, error) {
	for len(m.out) == 0 {
		if m.eof {
			if len(m.buf) == 0 {
				return 0, io.EOF
			}
			m.emit(len(m.buf))
			break
		}
		n, err := m.src.Read(m.chunk)
		m.buf = append(m.buf, m.chunk[:n]...)
		if err == io.EOF {
			m.eof = true
		} else if err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(m.buf, '\n'); i >= 0 {
			m.emit(i + 1)
		} else if len(m.buf) > maxRewriteLine {
			m.out, m.buf = append(m.out, m.buf...), m.buf[:0]
		}
	}
	n := copy(p, m.out)
	m.out = m.out[n:]
	return n, nil
}

// emit edits buf's first n bytes into out.
func (m *lineRewriter) emit(n int) {
	m.out = m.edit(m.out[:0], m.buf[:n])
	m.buf = append(m.buf[:0], m.buf[n:]...)
}

func (m *lineRewriter) Close() error { return m.src.Close() }
