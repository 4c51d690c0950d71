package overhead

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Command is one measuring `llmlb overhead`, its flags parsed: the
// benchmark's [Options] and where to write its report as JSON.
type Command struct {
	Options
	// JSONFile, if set, also gets the report as JSON.
	JSONFile string
}

// Run measures as c asks and prints the report's tables to stdout. Unlike
// [Run], it refuses a Duration or Scale that is not positive, measures this
// executable when LLMLB is "", and creates ProfileDir if need be.
func (c Command) Run(ctx context.Context, stdout io.Writer) error {
	if c.Duration <= 0 || c.Scale <= 0 {
		return errors.New("overhead: --duration and --scale must be positive")
	}
	if c.LLMLB == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("overhead: %w", err)
		}
		c.LLMLB = exe
	}
	if c.ProfileDir != "" {
		if err := os.MkdirAll(c.ProfileDir, 0o755); err != nil {
			return fmt.Errorf("overhead: --cpuprofile: %w", err)
		}
	}
	rep, err := Run(ctx, c.Options)
	if err != nil {
		return err
	}
	Write(stdout, rep)
	if c.JSONFile == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(c.JSONFile, append(b, '\n'), 0o644)
	}
	if err != nil {
		return fmt.Errorf("overhead: --json: %w", err)
	}
	return nil
}
