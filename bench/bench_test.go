package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/sim"
)

// TestBenchDeterministic: the same seed gives the same table twice, over
// every workload (cut small) and a spread of policies, and every request is
// accounted for.
func TestBenchDeterministic(t *testing.T) {
	if testing.Short() {
		t.Skip("a long virtual-time replay; make test runs it")
	}
	t.Parallel() // long and single-threaded: beside the others, it uses the second core
	opts := Options{
		Policies: []string{"default", "epp", "sglang-cache-aware", "ttft-true-cache", "llm-d-precise"},
		Backends: 4,
		Params:   Params{Scale: 0.006, Rate: 4, Seed: 7}, // compressed: scrapes cost by the virtual second
	}
	// The two runs go side by side, so they also show that runs share no
	// state.
	var a, b Report
	var errA, errB error
	var wg sync.WaitGroup
	wg.Go(func() { a, errA = Bench(context.Background(), opts) })
	wg.Go(func() { b, errB = Bench(context.Background(), opts) })
	wg.Wait()
	if err := errors.Join(errA, errB); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("same seed, different results:\n%s\n%s", ja, jb)
	}
	if len(a.Workloads) != len(WorkloadNames()) {
		t.Fatalf("%d tables for %d workloads", len(a.Workloads), len(WorkloadNames()))
	}
	for _, tb := range a.Workloads {
		for _, r := range tb.Results {
			if r.Failed != 0 || r.Throughput <= 0 || !(r.TTFTP50 > 0) || r.TTFTP99 < r.TTFTP50 || r.Imbalance < 1 {
				t.Errorf("%s/%s: %+v", tb.Name, r.Policy, r)
			}
		}
	}
	var out bytes.Buffer
	if err := WriteJSON(&out, a); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Workloads []struct {
			Name     string           `json:"name"`
			Backends int              `json:"backends"`
			Results  []map[string]any `json:"results"`
		} `json:"workloads"`
	}
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	want := []string{"policy", "ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p99", "output_tokens_per_s", "hit_rate", "imbalance", "refused", "failed"}
	for _, k := range want {
		if _, ok := back.Workloads[0].Results[0][k]; !ok {
			t.Errorf("JSON row lacks %q", k)
		}
	}
	if back.Workloads[0].Results[0]["policy"] != "default" || back.Workloads[0].Backends != 4 {
		t.Errorf("JSON: %+v", back.Workloads[0])
	}
}

// TestRunReleasesEveryRequest: after a replay, no request is left in any
// backend's ledger, whatever the policy, and every arrival is served,
// refused or failed.
func TestRunReleasesEveryRequest(t *testing.T) {
	w, err := Build("burst", Params{Scale: 0.1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, clients := range []int{0, 16} {
		for _, p := range []string{"default", "least-request", "consistent-hash"} {
			res, bal, err := runWith(Cluster{Presets: Presets(3, 1), Policy: p, Seed: 1, Clients: clients}, w)
			if err != nil {
				t.Fatal(err)
			}
			for _, be := range bal.Snapshot().Backends {
				if n := be.Ledger.InFlight(); n != 0 {
					t.Errorf("%s, %d clients: %s still has %d in flight", p, clients, be.ID, n)
				}
			}
			if got := len(res.TTFT) + res.Refused + res.Failed; got != len(w.Requests) {
				t.Errorf("%s, %d clients: %d served+refused+failed of %d arrivals", p, clients, got, len(w.Requests))
			}
		}
	}
}

// TestClosedLoop: one client sends each request when the last is answered,
// so the run lasts exactly the sum of the requests' times; more clients
// keep the servers busier and get more tokens out per second; the bench
// reports that throughput in its own column.
func TestClosedLoop(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	one, err := Run(Cluster{Presets: Presets(2, -1), Seed: 1, Clients: 1}, w)
	if err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	for _, d := range one.E2E {
		sum += d
	}
	if len(one.E2E) != len(w.Requests) || sum != one.Duration {
		t.Errorf("one client: %d of %d served, requests took %s in all, the run %s", len(one.E2E), len(w.Requests), sum, one.Duration)
	}
	many, err := Run(Cluster{Presets: Presets(2, -1), Seed: 1, Clients: 32}, w)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Run(Cluster{Presets: Presets(2, -1), Seed: 1, Clients: 32}, w)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := Summarize(many), Summarize(again); !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different closed-loop runs:\n%+v\n%+v", a, b)
	}
	if a, b := Summarize(one).Throughput, Summarize(many).Throughput; !(b > 4*a) {
		t.Errorf("32 clients got %.0f output tokens/s, one client %.0f", b, a)
	}
	rep, err := Bench(context.Background(), Options{Workloads: []string{"shared-prefix"}, Policies: []string{"default", "round-robin"},
		Backends: 4, Clients: 64, Params: Params{Scale: 0.1, Seed: 2}})
	if err != nil {
		t.Fatal(err)
	}
	tab := rep.Workloads[0]
	if tab.Clients != 64 {
		t.Errorf("table clients %d", tab.Clients)
	}
	for _, r := range tab.Results {
		if !(r.Saturated > r.Throughput) {
			t.Errorf("%s: saturated %.0f tokens/s, open loop %.0f", r.Policy, r.Saturated, r.Throughput)
		}
	}
	var out bytes.Buffer
	WriteTable(&out, tab)
	if !strings.Contains(out.String(), "saturated tok/s") || !strings.Contains(out.String(), "64 clients") {
		t.Errorf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}

// TestSaturationQueuesAndRefuses: a cluster far past capacity queues in the
// admission queue and refuses what waits past its timeout, as the proxy
// does, instead of piling onto the engines.
func TestSaturationQueuesAndRefuses(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.2, Rate: 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Cluster{Presets: Presets(1, -1), Seed: 1}, w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Refused == 0 {
		t.Errorf("no request refused at 20x the rate one server can take: %+v", Summarize(res))
	}
	if len(res.TTFT) == 0 {
		t.Error("nothing served")
	}
}

func TestWorkloadsDeterministicText(t *testing.T) {
	a := Part{ID: 42, Tokens: 600}
	b := Part{ID: 42, Tokens: 300}
	ta, tb := appendPart(nil, a), appendPart(nil, b)
	if !bytes.HasPrefix(ta, tb) || len(ta) != 2400 {
		t.Fatal("a shorter part is not a prefix of the longer one")
	}
	if bytes.Equal(appendPart(nil, Part{ID: 43, Tokens: 300})[:64], tb[:64]) {
		t.Fatal("different ids share a prefix")
	}
	for _, name := range WorkloadNames() {
		w, err := Build(name, Params{Scale: 0.01, Seed: 3})
		if err != nil || len(w.Requests) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
		for i := 1; i < len(w.Requests); i++ {
			if w.Requests[i].At < w.Requests[i-1].At {
				t.Fatalf("%s: arrivals out of order", name)
			}
		}
	}
	if _, err := Build("nope", Params{}); err == nil {
		t.Error("unknown workload accepted")
	}
}

// TestSweepReplicasExperiments: the sweep, the replica table and both
// published experiments run small, print their tables, and give the same
// numbers for the same seed.
func TestSweepReplicasExperiments(t *testing.T) {
	if testing.Short() {
		t.Skip("a long virtual-time replay; make test runs it")
	}
	t.Parallel() // long and single-threaded: beside the others, it uses the second core
	o := Options{Workloads: []string{"shared-prefix"}, Policies: []string{"default", "epp", "round-robin"}, Backends: 4, Params: Params{Scale: 0.05, Seed: 3}}
	run := func() string {
		var b strings.Builder
		curves, err := Sweep(context.Background(), o, []float64{0.5, 2})
		if err != nil {
			t.Fatal(err)
		}
		WriteSweep(&b, curves)
		o := o
		o.SharedLedger = 100 * time.Millisecond
		rows, err := Replicas(context.Background(), o, 3)
		if err != nil {
			t.Fatal(err)
		}
		WriteReplicas(&b, rows)
		return b.String()
	}
	a := run()
	if b := run(); a != b {
		t.Errorf("same seed, different output:\n%s\n---\n%s", a, b)
	}
	var b strings.Builder
	for _, name := range []string{"llm-d-kv-cache-wins", "sglang-v04-shared-prefix"} {
		sc, err := LookupExperiment(name)
		if err != nil {
			t.Fatal(err)
		}
		res, err := RunExperiment(context.Background(), sc, Params{Scale: 0.01, Seed: 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		WriteExperiment(&b, sc, res)
	}
	a += b.String()
	for _, want := range []string{"x0.5", "x2", "worst TTFT p90 ratio", "3 sharing their ledgers every 100ms", "kept 3 shared",
		"precise-scheduling", "542ms", "cache-aware router (v0.4)", "158596", "best first: published"} {
		if !strings.Contains(a, want) {
			t.Errorf("output lacks %q:\n%s", want, a)
		}
	}
}

// TestBenchOnlyPresetsAreExperiments: every row of a published
// experiment runs a preset, each bench-only preset runs some row, and
// serve accepts none of them.
func TestBenchOnlyPresetsAreExperiments(t *testing.T) {
	used := map[string]bool{}
	for _, e := range Experiments() {
		for _, row := range e.Rows {
			if _, err := balancer.LookupPreset(row.Policy); err != nil && row.Policy != DefaultPolicy {
				t.Errorf("experiment %s, row %s: %v", e.Name, row.Label, err)
			}
			used[row.Policy] = true
		}
	}
	for _, p := range balancer.Presets() {
		if p.BenchOnly && !used[p.Name] {
			t.Errorf("preset %s is bench-only, but no experiment runs it", p.Name)
		}
		if p.BenchOnly && slices.Contains(balancer.PolicyNames(), p.Name) {
			t.Errorf("preset %s is bench-only, but serve accepts it", p.Name)
		}
	}
}

// TestReplicasKeepTheirOwnState: with several replicas each balancer
// picks only the arrivals sent to it, so every replica's ledger sees part
// of the traffic and all are back to zero at the end.
func TestReplicasKeepTheirOwnState(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, bals, err := runAll(Cluster{Presets: Presets(4, -1), Policy: "default", Seed: 1, Replicas: 4}, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(bals) != 4 {
		t.Fatalf("%d balancers, want 4", len(bals))
	}
	for i, bal := range bals {
		total := int64(0)
		for _, be := range bal.Snapshot().Backends {
			if n := be.Ledger.InFlight(); n != 0 {
				t.Errorf("replica %d: %s still has %d in flight", i, be.ID, n)
			}
			total += be.Ledger.Total()
		}
		if total == 0 || total == int64(len(w.Requests)) {
			t.Errorf("replica %d picked %d of %d requests, want a share", i, total, len(w.Requests))
		}
	}
	served := 0
	for _, n := range res.PerBackend {
		served += n
	}
	if served+res.Refused+res.Failed != len(w.Requests) {
		t.Errorf("served %d + refused %d + failed %d != %d arrivals", served, res.Refused, res.Failed, len(w.Requests))
	}
}

// TestSharedLedgerShowsPeersWork: with the shared ledger, right after each
// tick every replica's ledger for a server holds the sum of the other
// replicas' own work on it; without it, nothing, though the replicas have
// work in flight.
func TestSharedLedgerShowsPeersWork(t *testing.T) {
	w, err := Build("burst", Params{Scale: 0.1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	const every = 100 * time.Millisecond
	for _, tc := range []struct {
		name   string
		shared time.Duration
	}{{"independent", 0}, {"shared", every}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := newRun(Cluster{Presets: Presets(4, -1), Policy: "default", Seed: 1, Replicas: 3, SharedLedger: tc.shared}, w)
			if err != nil {
				t.Fatal(err)
			}
			others, ticks := 0, 0 // ticks at which some replica had another's work in flight
			own := make([]balancer.Load, len(r.reps))
			for at := every; r.busy(); at += every {
				r.advance(at)
				busy := false
				for _, s := range r.servers {
					for k, rep := range r.reps {
						own[k] = rep.bal.Ledger(s.id).Own()
					}
					for k, rep := range r.reps {
						var want balancer.Load
						for j := range own {
							if j != k && tc.shared > 0 {
								want = want.Add(own[j])
							}
							busy = busy || j != k && own[j].InFlight > 0
						}
						if got := rep.bal.Ledger(s.id).Peers(); got != want {
							t.Fatalf("at %v, replica %d's Peers() on %s = %+v, want %+v", at, k, s.id, got, want)
						}
					}
				}
				if busy {
					ticks++
					if tc.shared > 0 {
						others++
					}
				}
			}
			if ticks == 0 {
				t.Fatal("no replica ever had work in flight at a tick")
			}
			if tc.shared > 0 && others == 0 {
				t.Error("no replica ever saw another's work")
			}
		})
	}
}

func TestPerturbChangesTheEnginesNotTheBalancer(t *testing.T) {
	for _, bad := range []string{"prefill", "prefill=0", "prefill=-1", "prefill=x", "speed=2", "prefill=+Inf"} {
		if _, err := ParsePerturb(bad); err == nil {
			t.Errorf("ParsePerturb(%q) accepted", bad)
		}
	}
	p, err := ParsePerturb("prefill=2, request=0.5,tokens=0.6,decode=1.5")
	if err != nil || p != (Perturb{Prefill: 2, Request: 0.5, Tokens: 0.6, Decode: 1.5}) || p.String() != "prefill=2,request=0.5,decode=1.5,tokens=0.6" {
		t.Fatalf("ParsePerturb = %+v, %v (%q)", p, err, p.String())
	}
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	run := func(p Perturb) Row {
		res, err := Run(Cluster{Presets: Presets(4, 0), Policy: "default", Seed: 3, Perturb: p}, w)
		if err != nil {
			t.Fatal(err)
		}
		return Summarize(res)
	}
	base, dear, slow := run(Perturb{}), run(Perturb{Prefill: 3, Request: 3}), run(Perturb{Decode: 2})
	if dear.TTFTP50 <= base.TTFTP50 {
		t.Errorf("engines 3x dearer: TTFT p50 %v, not above the unperturbed %v", dear.TTFTP50, base.TTFTP50)
	}
	if slow.TPOTP50 < 1.5*base.TPOTP50 {
		t.Errorf("steps 2x dearer: TPOT p50 %v, the unperturbed %v", slow.TPOTP50, base.TPOTP50)
	}
}

// TestKVEventsKeepReplicasTogether: on the Mooncake conversation trace,
// whose prompts carry no conversation key, eight replicas that read the
// servers' KV events keep most of one replica's hit rate, where eight that
// know only their own picks lose about half of it. A twentieth of the
// trace is a noisy draw: at seeds 1-4 (`llmlb bench --workload
// mooncake-conversation --scale 0.05 --replicas 8 [--kv-events]`), 8
// replicas with events hit 9.1-9.5% and those without 4.8-6.5%, 1.42-1.92
// times as much, so the test asks for 1.25.
func TestKVEventsKeepReplicasTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("a long virtual-time replay; make test runs it")
	}
	t.Parallel() // long and single-threaded: beside the others, it uses the second core
	w, err := Build("mooncake-conversation", Params{Scale: 0.05, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	hit := func(replicas int, events bool) float64 {
		res, bals, err := runAll(Cluster{Presets: Presets(8, 0), Policy: "default", Seed: 1, Replicas: replicas, KVEvents: events}, w)
		if err != nil {
			t.Error(err) // not Fatal: hit runs on its own goroutine
			return 0
		}
		if !bals[0].ReadsCacheEvents() && events {
			t.Error("the default does not read KV events")
		}
		return float64(res.CachedTokens) / float64(res.PromptTokens)
	}
	// The three runs are independent: side by side, they use both cores.
	var one, eight, eightEvents float64
	var wg sync.WaitGroup
	wg.Go(func() { one = hit(1, true) })
	wg.Go(func() { eight = hit(8, false) })
	wg.Go(func() { eightEvents = hit(8, true) })
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("hit rate: 1 replica with events %.3f, 8 without %.3f, 8 with %.3f", one, eight, eightEvents)
	if eightEvents < 0.75*one || eightEvents < 1.25*eight {
		t.Errorf("8 replicas reading events kept %.3f of one replica's hit rate (%.3f against %.3f); 8 without them %.3f", eightEvents/one, eightEvents, one, eight)
	}
}

// FuzzParsePerturb: --perturb never panics, and what it accepts prints in
// a form that reads back to the same perturbation (a factor of 1 and a
// tokenizer of 4 change nothing, so they print as nothing).
func FuzzParsePerturb(f *testing.F) {
	for _, s := range []string{"", "prefill=2", "prefill=2,request=0.5,tokens=0.6,tokenizer=7", "tokenizer=6.6", "tokenizer=17", "x=1", "prefill=-1", "tokens=NaN", "prefill=1,request=1", "tokenizer=4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePerturb(s)
		if err != nil {
			return
		}
		q, err := ParsePerturb(p.String())
		if err != nil || q.String() != p.String() || factor(q.Prefill) != factor(p.Prefill) || factor(q.Request) != factor(p.Request) ||
			factor(q.Tokens) != factor(p.Tokens) || q.tokenizer() != p.tokenizer() {
			t.Fatalf("ParsePerturb(%q) = %+v, printed %q, read back %+v, %v", s, p, p.String(), q, err)
		}
	})
}

// TestSameStatsReadsEveryField: a scrape reuses the last reading only when
// every field of the stats a page is rendered from is unchanged, so a field
// added to sim.Stats and not compared fails here.
func TestSameStatsReadsEveryField(t *testing.T) {
	var base sim.Stats
	if !sameStats(&base, &base) {
		t.Fatal("equal stats are not the same")
	}
	typ := reflect.TypeFor[sim.Stats]()
	for i := range typ.NumField() {
		other := base
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		case reflect.Float64:
			f.SetFloat(0.5)
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"a"}))
		default:
			t.Fatalf("sim.Stats.%s: a %s, which this test cannot vary", typ.Field(i).Name, f.Kind())
		}
		if sameStats(&base, &other) {
			t.Errorf("sim.Stats.%s differs and sameStats says the page is the same", typ.Field(i).Name)
		}
	}
}

// The default policy's pick estimates each request's time to first
// token, and the row reports how far those estimates were from the first
// tokens; one idle server, one client at a time: nothing queues, so the
// estimate is the prefill alone and lands near what the engine takes. A
// policy that estimates nothing reports nothing.
func TestEstimateErrorIsReported(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Cluster{Presets: Presets(1, -1), Seed: 1, Clients: 1}, w)
	if err != nil {
		t.Fatal(err)
	}
	row := Summarize(res)
	if len(res.EstimateRatios) != len(w.Requests) || row.EstimateRatio <= 0 {
		t.Fatalf("%d estimates for %d requests; ratio %v, error %v", len(res.EstimateRatios), len(w.Requests), row.EstimateRatio, row.EstimateError)
	}
	if row.EstimateRatio < 0.5 || row.EstimateRatio > 2 {
		t.Errorf("idle, one at a time: the median estimate is %.2fx the first token's time", row.EstimateRatio)
	}
	rr, err := Run(Cluster{Presets: Presets(1, -1), Seed: 1, Clients: 1, Policy: "round-robin"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.EstimateRatios) != 0 || Summarize(rr).EstimateRatio != 0 {
		t.Errorf("round-robin estimates nothing: %d ratios", len(rr.EstimateRatios))
	}
	var b strings.Builder
	WriteTable(&b, Table{Name: "x", Results: []Row{row, Summarize(rr)}})
	if !strings.Contains(b.String(), "ttft est err") {
		t.Errorf("the table has no estimate column:\n%s", b.String())
	}
}

// With SLO targets, a run counts the served requests that met them: all
// of them against a loose target, none against one no request can meet,
// and the row turns the count into goodput and the share of requests sent
// (a refused one missed).
func TestGoodput(t *testing.T) {
	w, err := Build("shared-prefix", Params{Scale: 0.05, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		slo  SLO
		want func(met, served int) bool
	}{
		{SLO{TTFT: time.Hour, TPOT: time.Hour}, func(met, served int) bool { return met == served && served > 0 }},
		{SLO{TTFT: time.Nanosecond}, func(met, _ int) bool { return met == 0 }},
		{SLO{}, func(met, _ int) bool { return met == 0 }},
	} {
		res, err := Run(Cluster{Presets: Presets(2, -1), Seed: 1, SLO: c.slo}, w)
		if err != nil {
			t.Fatal(err)
		}
		if !c.want(res.Met, len(res.TTFT)) {
			t.Errorf("SLO %+v: %d of %d served met it", c.slo, res.Met, len(res.TTFT))
		}
		if row := Summarize(res); row.SLO != (c.slo != SLO{}) {
			t.Errorf("SLO %+v: row says SLO %v", c.slo, row.SLO)
		}
	}
	row := Summarize(Result{SLO: SLO{TTFT: time.Second}, Met: 3, TTFT: make([]time.Duration, 4), Refused: 1, Duration: 2 * time.Second})
	if row.Goodput != 1.5 || row.Attainment != 0.6 {
		t.Errorf("3 of 5 sent met in 2s: goodput %v, attainment %v; want 1.5/s and 0.6", row.Goodput, row.Attainment)
	}
}
