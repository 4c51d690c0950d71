package overhead

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// ServeGoProxy runs the "go" row's process: Go's own reverse proxy
// (net/http/httputil.ReverseProxy, no parsing, routing, metrics or
// observing) in front of backend, with the transport settings llmlb's
// proxy uses, on a loopback port it prints as "serving on http://ADDR",
// until ctx ends. Every Go proxy starts from what this one costs, so the
// row shows how much of llmlb's cost is its own code and how much is
// Go's HTTP server and client.
func ServeGoProxy(ctx context.Context, backend string, stdout io.Writer) error {
	bu, err := url.Parse(backend)
	if err != nil || bu.Host == "" || (bu.Scheme != "http" && bu.Scheme != "https") {
		return fmt.Errorf("overhead: --go-proxy: %q is not an http(s) URL", backend)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// As proxy.New: no HTTP_PROXY, 256 idle connections to the backend,
	// content encodings passed through, HTTP/1.1.
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	srv := &http.Server{
		Handler: &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(bu) },
			Transport: tr,
			ErrorLog:  log.New(io.Discard, "", 0),
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	fmt.Fprintf(stdout, "serving on http://%s\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		_ = srv.Close()
		<-done
		return nil
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
