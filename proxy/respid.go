package proxy

import (
	"bytes"
	"encoding/hex"
	"net/http"

	"github.com/cespare/xxhash/v2"

	"github.com/llmlb/llmlb/balancer"
)

// A stored response lives in the memory of the server that made it (vLLM
// with VLLM_ENABLE_RESPONSES_API_STORE=1, the emulated engines), so every
// request that names it must reach that server. llmlb keeps no table for
// this: the id a client is handed is the server's own id, a dot, and a tag
// naming the server, and llmlb strips the tag on the way back in. Any
// replica, after any restart or reload, reads the same server from the
// same id.
//
// The tag is 16 hex digits of a hash of the backend's ID (its URL), not
// the URL itself, so clients do not learn backend addresses. A client may
// forge a tag, but the request it makes is still checked like any other:
// the server must be one of llmlb's backends, serve the request's model
// (for a follow-up) or a model the key allows (for a look-up by id), so a
// forged tag reaches no server the key could not reach anyway.

// respTagLen is the length of a response id's tag, hex digits.
const respTagLen = 16

// maxResponseIDLen bounds a client-supplied response id; vLLM's are
// "resp_" and 32 hex digits.
const maxResponseIDLen = 256

// responseTag is the tag of the backend whose ID is id.
func responseTag(id string) string {
	var b [8]byte
	h := xxhash.Sum64String("llmlb response store\x00" + id)
	for i := range b {
		b[i] = byte(h >> (56 - 8*i))
	}
	return hex.EncodeToString(b[:])
}

// tagResponseID returns the id a client is handed for the server's own
// id, stored on the backend tagged tag.
func tagResponseID(id, tag string) string { return id + "." + tag }

// splitResponseID reads a client's response id: the server's own id and
// the tag of the backend that stores it. ok is false for an id llmlb did
// not hand out: too long, no tag, or a character outside the ids servers
// make (letters, digits, '_' and '-'), which could not be sent in a URL
// path as it is.
func splitResponseID(id string) (server, tag string, ok bool) {
	if len(id) > maxResponseIDLen || len(id) < respTagLen+2 {
		return "", "", false
	}
	cut := len(id) - respTagLen - 1
	server, tag = id[:cut], id[cut+1:]
	if id[cut] != '.' {
		return "", "", false
	}
	for i := 0; i < len(tag); i++ {
		if c := tag[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", "", false
		}
	}
	for i := 0; i < len(server); i++ {
		if !idByte(server[i]) {
			return "", "", false
		}
	}
	return server, tag, true
}

// idByte reports whether c may appear in a server's response id.
func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// holderOf returns the backend of snap that tag names, nil if none does.
func holderOf(snap *balancer.Snapshot, tag string) *balancer.Backend {
	for _, be := range snap.Backends {
		if responseTag(be.ID) == tag {
			return be
		}
	}
	return nil
}

// responseIDError is a response id that leads to no server: not one llmlb
// handed out, or stored by a server llmlb no longer has or that is down.
func responseIDError(param, id, why string, status int) *HTTPError {
	e := &HTTPError{Status: status, Type: "invalid_request_error", Param: param, Code: "response_not_found",
		Msg: "Response with id " + quote(id) + " " + why}
	if status == http.StatusServiceUnavailable {
		e.Type, e.Code, e.RetryAfter = "service_unavailable", "response_server_unavailable", noBackendRetryAfter
	}
	return e
}

// respPrefix starts every response id vLLM, SGLang and the emulated
// engines make.
var respPrefix = []byte(`"resp_`)

// tagResponseIDs appends line to dst with every JSON string that is a
// response id (`"resp_…"`, of id bytes only) tagged: every response id a
// server sends names a response it stores. A quote escaped inside a
// string is not the start of one.
func tagResponseIDs(dst, line []byte, tag string) []byte {
	for {
		i := bytes.Index(line, respPrefix)
		if i < 0 {
			return append(dst, line...)
		}
		j := i + len(respPrefix)
		for j < len(line) && idByte(line[j]) {
			j++
		}
		if j >= len(line) || line[j] != '"' || escaped(line, i) {
			dst = append(dst, line[:j]...)
			line = line[j:]
			continue
		}
		dst = append(dst, line[:j]...)
		dst = append(append(dst, '.'), tag...)
		line = line[j:]
	}
}

// escaped reports whether the byte at i is preceded by an odd number of
// backslashes.
func escaped(b []byte, i int) bool {
	n := 0
	for i > 0 && b[i-1] == '\\' {
		n++
		i--
	}
	return n%2 == 1
}
