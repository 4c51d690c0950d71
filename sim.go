package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/llmlb/llmlb/sim"
)

// cmdSim runs emulated model servers until ctx ends.
func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", "llmlb sim [--engine vllm] [--role both] [--preset h100-8b] [--listen ADDR] [--model NAME] [--lora a,b] [--max-lora N] [--bytes-per-token B] [--speed X] [--count N] [--data-parallel-size N [--data-parallel-start-rank R]] [--fault KIND[:k=v,...],... [--fault-on 0,2]]", stderr)
	engine := fs.String("engine", "vllm", "engine flavour to emulate: vllm, sglang, triton-tensorrt-llm or trtllm-serve")
	role := fs.String("role", "both", "disaggregated prefill/decode role: prefill, decode or both (SGLang servers of one process share bootstrap rooms)")
	preset := fs.String("preset", "h100-8b", "engine model preset: "+strings.Join(sim.PresetNames(), ", "))
	listen := fs.String("listen", "127.0.0.1:8001", "address of the first server; --count servers take consecutive ports")
	model := fs.String("model", "llama-3.1-8b", "base model name served")
	lora := fs.String("lora", "", "comma-separated LoRA adapter names served on top of the model")
	speed := fs.Float64("speed", 1, "run this many times faster than real time")
	count := fs.Int("count", 1, "number of servers to start")
	dpSize := fs.Int("data-parallel-size", 1, "data-parallel ranks each server runs behind its port (vllm and sglang), its metrics labelled engine=\"<rank>\" (vllm) or dp_rank=\"<rank>\" (sglang) and X-data-parallel-rank honoured, as vllm serve --data-parallel-size or sglang --dp-size")
	dpStart := fs.Int("data-parallel-start-rank", 0, "global rank of each server's first rank, as vllm serve --data-parallel-start-rank")
	prefillRate := fs.Float64("prefill-rate", 1, "prefill this many times as fast as the preset (0.7: a server slower than the preset, as the one llmlb bench --calibrate should find)")
	maxLoRA := fs.Int("max-lora", 0, "adapters a batch may use at once (0: the preset's)")
	bpt := fs.Int("bytes-per-token", 4, "bytes of prompt text the emulated tokenizer reads a token, 1-16 (token ids count one each; KV-cache events need 4)")
	kinds := strings.ReplaceAll(strings.Trim(fmt.Sprint(sim.FaultKinds()), "[]"), " ", ", ") // a list of one-word names
	faultSpec := fs.String("fault", "", "faults to show, e.g. die-mid-stream:after=5s,for=10s or die-mid-stream:events=3,framing=clean,share=0.2 (kinds: "+kinds+"); switch them at runtime with PUT /sim/faults")
	faultOnList := fs.String("fault-on", "0", "comma-separated indexes (from 0) of the servers --fault applies to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	faults, err := sim.ParseFaults(*faultSpec)
	if err != nil {
		return fmt.Errorf("sim: --fault: %w", err)
	}
	faultOn, err := sim.ParseServerList(*faultOnList)
	if err != nil {
		return fmt.Errorf("sim: --fault-on: %w", err)
	}
	ecfg, err := sim.Preset(*preset)
	if err != nil {
		return fmt.Errorf("sim: --preset: %w", err)
	}
	if *maxLoRA > 0 {
		ecfg.MaxLoRA = *maxLoRA
	}
	if !(*prefillRate > 0) || math.IsInf(*prefillRate, 0) {
		return fmt.Errorf("sim: --prefill-rate must be a positive factor, got %v", *prefillRate)
	}
	ecfg.Cost = ecfg.Cost.PrefillRate(*prefillRate)
	if *count < 1 || *dpSize < 1 {
		return errors.New("sim: --count and --data-parallel-size must be at least 1")
	}
	if *bpt < 1 || *bpt > 16 {
		return fmt.Errorf("sim: --bytes-per-token must be from 1 to 16, got %d", *bpt)
	}
	ecfg.CacheOnCompute = sim.CachesOnCompute(*engine)
	fc := sim.FleetConfig{Server: sim.ServerConfig{Engine: *engine, Model: *model, DataParallelStartRank: *dpStart, BytesPerToken: *bpt, PD: sim.PDConfig{Role: *role, Rooms: sim.NewRooms()}},
		DataParallelSize: *dpSize, Speed: *speed, Listen: *listen, Faults: faults, FaultOn: faultOn}
	if *lora != "" {
		fc.Server.Adapters = strings.Split(*lora, ",")
	}
	for range *count {
		fc.Engines = append(fc.Engines, ecfg)
	}
	fleet, err := sim.StartFleet(fc)
	if err != nil {
		return err
	}
	for i, u := range fleet.URLs {
		fmt.Fprintf(stdout, "sim: %s (%s, x%g) serving %s at %s", *engine, *preset, *speed, *model, u)
		if *dpSize > 1 {
			fmt.Fprintf(stdout, " with data-parallel ranks %d-%d", *dpStart, *dpStart+*dpSize-1)
		}
		if slices.Contains(faultOn, i) && len(faults) > 0 {
			fmt.Fprint(stdout, " with faults "+faults.String())
		}
		fmt.Fprintln(stdout)
	}
	<-ctx.Done()
	fleet.Close()
	return nil
}
