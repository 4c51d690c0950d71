package serve

import (
	"crypto/sha256"
	"testing"
)

// TestSettlerWaitsForAFileToHold: a changed file is reloaded at the second
// poll that sees the same content, never at the first; content that changes
// between polls (a file being written) waits again; going back to the
// running content cancels.
func TestSettlerWaitsForAFileToHold(t *testing.T) {
	run, half, full := sha256.Sum256([]byte("a")), sha256.Sum256([]byte("b")), sha256.Sum256([]byte("bc"))
	var s settler
	steps := []struct {
		seen [32]byte
		want bool
	}{
		{run, false}, {half, false}, {full, false}, {full, true}, // written in two goes: only the whole one
		{half, false}, {run, false}, {half, false}, {half, true}, // back to the running content in between
	}
	for i, st := range steps {
		if got := s.ready(st.seen, run); got != st.want {
			t.Fatalf("poll %d: reload %v, want %v", i, got, st.want)
		}
	}
}
