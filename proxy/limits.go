package proxy

import (
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HTTPServer returns the client listener's server: [Server.Handler] behind
// the header and body limits, with the header, idle and header-size limits
// of Config. errorLog receives net/http's own messages (nil: the standard
// logger). Served on a [Shedder]'s listener, its connections are counted
// against proxy.max_reading_connections.
func (s *Server) HTTPServer(errorLog *log.Logger) *http.Server {
	return &http.Server{
		ConnContext:       connContext,
		ConnState:         connState,
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		// Go refuses larger headers itself, in plain text, before any
		// handler runs; above our own limit and below this one the limits
		// middleware answers 431 in OpenAI's shape.
		MaxHeaderBytes: 2 * s.cfg.MaxHeaderBytes,
		ErrorLog:       errorLog,
	}
}

// limits refuses requests whose headers are over proxy.max_header_bytes or
// proxy.max_header_count with 431 in OpenAI's shape, and bounds the time
// the client may take to send its body by proxy.body_read_timeout. The
// read deadline it sets also bounds the server's own read of an unread
// body after the handler returns; readRequest lifts it once the body is in.
// On a [Shedder]'s connection, the request stops counting as waiting once
// its body is in.
func (s *Server) limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, size := headerSize(r); n > s.cfg.MaxHeaderCount || size > s.cfg.MaxHeaderBytes {
			w.Header().Set("Connection", "close")
			writeError(w, &HTTPError{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: "request_header_fields_too_large",
				Msg: "The request has " + strconv.Itoa(n) + " header fields in " + strconv.Itoa(size) + " bytes; the limits are " +
					strconv.Itoa(s.cfg.MaxHeaderCount) + " fields and " + strconv.Itoa(s.cfg.MaxHeaderBytes) + " bytes."})
			return
		}
		if r.ContentLength != 0 { // -1: chunked, length unknown
			// An error means a writer that cannot set deadlines (a test
			// recorder); there is no connection to protect then.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
		}
		watchRequest(r)
		next.ServeHTTP(w, r)
	})
}

// headerSize returns the number of header fields r carries and the bytes
// of its request line and headers as sent (Host included in the bytes),
// as net/http counts them against MaxHeaderBytes.
func headerSize(r *http.Request) (fields, size int) {
	size = len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	size += len("Host: ") + len(r.Host) + 2
	for k, vs := range r.Header {
		fields += len(vs)
		for _, v := range vs {
			size += len(k) + 2 + len(v) + 2
		}
	}
	return fields, size
}

// stripClientHeaders removes from an outbound request the headers a client
// must not be able to set for the backend: llmlb's own x-llmlb-* headers
// and client-supplied forwarding headers (the proxy sets X-Forwarded-For,
// -Host and -Proto itself, from the connection). Names are compared
// without case and with _ read as -, since some servers treat them alike.
func stripClientHeaders(h http.Header) {
	for k := range h {
		if headerHasPrefix(k, "x-llmlb-") || headerHasPrefix(k, "x-forwarded-") {
			delete(h, k)
			continue
		}
		for _, n := range []string{"forwarded", "x-real-ip", "x-client-ip", "true-client-ip", "x-original-forwarded-for", "cf-connecting-ip"} {
			if len(k) == len(n) && headerHasPrefix(k, n) {
				delete(h, k)
			}
		}
	}
}

// headerHasPrefix reports whether header name k starts with prefix, a
// lower-case name with -, read without case and with _ as -. It compares
// bytes, so that no header costs an allocation: header names are ASCII
// tokens (net/http refuses others).
func headerHasPrefix(k, prefix string) bool {
	if len(k) < len(prefix) {
		return false
	}
	for i := range len(prefix) {
		c := k[i]
		switch {
		case c == '_':
			c = '-'
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// stripBackendHeaders removes x-llmlb-* headers a backend sent, and with
// keys its x-ratelimit-* headers, so that a client sees only the proxy's
// own.
func stripBackendHeaders(h http.Header, keys bool) {
	for k := range h {
		if strings.EqualFold(k[:min(len(k), len("x-llmlb-"))], "x-llmlb-") ||
			keys && strings.EqualFold(k[:min(len(k), len("x-ratelimit-"))], "x-ratelimit-") {
			delete(h, k)
		}
	}
}
