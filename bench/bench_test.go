package bench

import (
	"context"
	"os"
	"testing"
)

func TestBenchManual(t *testing.T) {
	if os.Getenv("BENCH_MANUAL") == "" {
		t.Skip("manual")
	}
	rep, err := Bench(context.Background(), Options{Workloads: []string{os.Getenv("BENCH_MANUAL")}, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range rep.Workloads {
		WriteTable(os.Stdout, tb)
	}
}
