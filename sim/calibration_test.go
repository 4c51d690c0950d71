package sim

import (
	"fmt"
	"math"
	"testing"
)

// TestCalibration holds the engine model to the published measurements of
// the calibration table, each within its stated tolerance, and prints the
// table docs/simulator.md shows (go test -run TestCalibration -v ./sim).
func TestCalibration(t *testing.T) {
	for _, c := range Calibrations() {
		got := c.Model()
		ratio := got / c.Published
		t.Logf("| %s | %s | %s %s | %.4g %s | %.2f | ±%.0f%% |", c.Quantity, c.Preset, fmt.Sprint(c.Published), c.Unit, got, c.Unit, ratio, 100*c.Tolerance)
		if math.IsNaN(got) || math.Abs(ratio-1) > c.Tolerance {
			t.Errorf("%s on %s = %.4g %s, published %.4g (%s): ratio %.2f, tolerance ±%.0f%%", c.Quantity, c.Preset, got, c.Unit, c.Published, c.Source, ratio, 100*c.Tolerance)
		}
	}
	for _, c := range Unheld() {
		got := c.Model()
		t.Logf("| %s | %s | %s %s | %.4g %s | %.2f | not held |", c.Quantity, c.Preset, fmt.Sprint(c.Published), c.Unit, got, c.Unit, got/c.Published)
	}
}
