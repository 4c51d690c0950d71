package sim

import "testing"

// TestReceivedBlocksAreHeld: the blocks of a KV transfer are held in the
// decode server's prefix cache, so that its request hits them; a cache
// that cannot take them all takes what fits.
func TestReceivedBlocksAreHeld(t *testing.T) {
	e := NewEngine(EngineConfig{BlockSize: 16, NumBlocks: 64})
	cfg := e.Config()
	hashes := BlockHashes(nil, 1, make([]byte, 40*cfg.BlockSize*BytesPerToken), cfg.BlockSize*BytesPerToken)
	e.Receive(hashes)
	if got, want := e.Holds(hashes), len(hashes)*cfg.BlockSize; got != want {
		t.Errorf("Holds after receive = %d tokens, want %d", got, want)
	}
	more := BlockHashes(nil, 2, make([]byte, 100*cfg.BlockSize*BytesPerToken), cfg.BlockSize*BytesPerToken)
	e.Receive(more)
	if got := e.Holds(more); got == 0 || got > cfg.NumBlocks*cfg.BlockSize {
		t.Errorf("Holds after a transfer larger than the cache = %d tokens", got)
	}
}
