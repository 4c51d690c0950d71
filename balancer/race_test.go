//go:build race

package balancer

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation counts are not checked.
const raceEnabled = true
