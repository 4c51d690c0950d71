package scrape

import (
	"io"
	"log/slog"
	"strings"
	"sync"
)

// syncBuilder is a strings.Builder safe for a logger and a test to share.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

var builders sync.Map // *strings.Builder -> *syncBuilder

func newTextLogger(w *syncBuilder) *slog.Logger {
	builders.Store(&w.b, w)
	return slog.New(slog.NewTextHandler(io.Writer(w), nil))
}

// syncString reads a builder handed out by runManager under its lock.
func syncString(b *strings.Builder) string {
	v, _ := builders.Load(b)
	s := v.(*syncBuilder)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
