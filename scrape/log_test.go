package scrape

import (
	"log/slog"
	"strings"
	"sync"
)

// syncLog is a log sink safe for a logger and a test to share.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncLog) logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }
