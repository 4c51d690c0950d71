package proxy

import (
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/balancer"
	"github.com/llmlb/llmlb/proxy/stream"
)

// recentPicks is how many picks the status page lists.
const recentPicks = 30

// pickLog remembers the latest picks and, per backend, the prompt tokens
// and cached tokens its answers reported, for the status page.
type pickLog struct {
	mu      sync.Mutex
	ring    [recentPicks]pickEntry // guarded by mu
	next    int                    // guarded by mu
	n       int                    // guarded by mu
	reasons map[string]int64       // guarded by mu; picks by reason since start
	tokens  map[string][2]int64    // guarded by mu; backend -> prompt, cached
	// guarded by mu; backend -> predicted and observed TTFT seconds, and
	// predicted and reported cached tokens, summed as the metrics
	// llmlb_ttft_{predicted,observed}_seconds_total and
	// llmlb_prefix_{predicted,reported}_tokens_total sum them
	calib map[string][4]float64
}

type pickEntry struct {
	At      time.Time
	ID      string
	Model   string
	Backend string // its ID, "-" when llmlb answered itself
	// BackendName is the backend's name, as x-llmlb-backend gives it;
	// "" when llmlb answered itself.
	BackendName string
	Reason      string
	Status      int
	TTFT        time.Duration // streams: to the first token; 0 otherwise
	// Duration is from the request's arrival to its last byte, so a
	// non-streaming request, which has no TTFT, still shows its time.
	Duration time.Duration
}

func newPickLog() *pickLog {
	return &pickLog{reasons: map[string]int64{}, tokens: map[string][2]int64{}, calib: map[string][4]float64{}}
}

// estimates are what a request's pick predicted against what came: sums
// holds its TTFT in seconds, predicted and observed, when ttft is set,
// then its cached tokens, predicted and reported, when cached is.
type estimates struct {
	ttft, cached bool
	sums         [4]float64
}

// add records a finished request: answered by a backend, or by llmlb
// itself (a rejection, or no backend could answer). Only answers from a
// backend count towards the picks by reason.
func (p *pickLog) add(e pickEntry, u stream.Usage, est estimates) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if est.ttft || est.cached {
		c := p.calib[e.Backend]
		for i, v := range est.sums {
			c[i] += v
		}
		p.calib[e.Backend] = c
	}
	p.ring[p.next] = e
	p.next = (p.next + 1) % recentPicks
	p.n = min(p.n+1, recentPicks)
	if e.Backend != "-" {
		p.reasons[e.Reason]++
	}
	if u.Known && u.CachedKnown {
		t := p.tokens[e.Backend]
		t[0] += int64(u.Prompt)
		t[1] += int64(u.Cached)
		p.tokens[e.Backend] = t
	}
}

// estimates returns backend's predicted over observed TTFT and cached
// tokens, "-" for none.
func (p *pickLog) estimates(backend string) (ttft, cached string) {
	p.mu.Lock()
	c := p.calib[backend]
	p.mu.Unlock()
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	return ratio(c[0], c[1]), ratio(c[2], c[3])
}

// view returns the picks newest first, the counts by reason and each
// backend's reported hit rate.
func (p *pickLog) view() (recent []pickEntry, reasons []reasonCount, hit map[string]float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.n {
		recent = append(recent, p.ring[(p.next-1-i+recentPicks)%recentPicks])
	}
	for r, n := range p.reasons {
		reasons = append(reasons, reasonCount{r, n})
	}
	slices.SortFunc(reasons, func(a, b reasonCount) int { return strings.Compare(a.Reason, b.Reason) })
	hit = map[string]float64{}
	for be, t := range p.tokens {
		if t[0] > 0 {
			hit[be] = float64(t[1]) / float64(t[0])
		}
	}
	return recent, reasons, hit
}

type reasonCount struct {
	Reason string
	N      int64
}

// statusRow is one backend's line on the status page.
type statusRow struct {
	Name, ID, Engine, Labels, State, Reason, Warning string // Name is what clients see in x-llmlb-backend
	Role                                             string // prefill or decode; "" for both
	Queued, Running, KV                              string
	InFlight, Requests, Failures                     int64
	Ejections                                        int
	TTFT, HitRate                                    string
	TTFTEst, CachedEst                               string   // the picks' estimates over what came ([pickLog.estimates])
	Addr                                             string   // ID without "http://": the URL, short enough not to wrap
	Models                                           []string // and adapters
	LoRA                                             string
	Stale                                            bool
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{"ms": fmtMS}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="2">
<title>llmlb status</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1240px}
h1{font-size:1.3em;margin:0 0 .2em} h2{font-size:1.05em;margin:1.4em 0 .4em}
.sub{color:#666}
table{border-collapse:collapse;max-width:100%} th,td{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
th{background:#f4f4f4} td.l,th.l{text-align:left}
td.wrap{white-space:normal;overflow-wrap:anywhere;max-width:16em}
td.addr{min-width:8.5em} td.models{min-width:6.5em}
tr.backend.detail td{border-bottom-color:transparent}
tr.why td{white-space:normal;overflow-wrap:anywhere;text-align:left;padding-top:0;color:#555}
.ready{color:#08702a;font-weight:600} .down{color:#b00020;font-weight:600} .draining{color:#a65e00;font-weight:600} .unknown{color:#666}
.stale{color:#a65e00} .warn{color:#b00020}
dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;color:#555;margin:.4em 0} dt{font-weight:600}
</style></head><body>
<h1>llmlb</h1>
<div class="sub">policy <b>{{.Policy}}</b> · {{len .Rows}} backends, {{.Ready}} ready · admission queue {{.Queue}}{{if .Fleet}} · {{.Fleet}}{{end}} · up {{.Uptime}} · {{.Now}}</div>
<h2>Backends</h2>
<table id="backends">
<tr><th class="l">backend</th><th class="l">engine</th><th class="l">health</th><th>queued</th><th>running</th><th>KV use</th><th>in flight</th><th>requests</th><th>failures</th><th>ejections</th><th>TTFT<br><span class="sub">est/obs</span></th><th>prefix hits<br><span class="sub">est/rep</span></th><th class="l">models</th><th class="l">LoRA</th></tr>
{{range .Rows}}<tr class="backend{{if or .Reason .Warning}} detail{{end}}">
<td class="l wrap addr">{{.Name}}<br><span class="sub">{{.Addr}}</span></td><td class="l">{{.Engine}}{{if .Role}} <span class="sub">{{.Role}}</span>{{end}}{{if .Labels}} <span class="sub">{{.Labels}}</span>{{end}}{{if .Warning}} <span class="warn" title="{{.Warning}}">&#9888;</span>{{end}}</td>
<td class="l"><span class="{{.State}}">{{.State}}</span></td>
<td>{{.Queued}}</td><td>{{.Running}}</td><td>{{.KV}}{{if .Stale}} <span class="stale" title="metrics stale">stale</span>{{end}}</td>
<td>{{.InFlight}}</td><td>{{.Requests}}</td><td>{{.Failures}}</td><td>{{.Ejections}}</td><td>{{.TTFT}}<br><span class="sub">{{.TTFTEst}}</span></td><td>{{.HitRate}}<br><span class="sub">{{.CachedEst}}</span></td>
<td class="l wrap models">{{range $i, $m := .Models}}{{if $i}}, {{end}}{{$m}}{{else}}-{{end}}</td><td class="l wrap">{{.LoRA}}</td></tr>
{{if or .Reason .Warning}}<tr class="why"><td colspan="14">{{if .Reason}}<span class="{{.State}}">{{.State}}:</span> {{.Reason}}{{end}}{{if and .Reason .Warning}}<br>{{end}}{{if .Warning}}<span class="warn">&#9888; {{.Warning}}</span>{{end}}</td></tr>{{end}}
{{else}}<tr><td class="l" colspan="14">no backends</td></tr>{{end}}
</table>
<dl class="legend">
<dt>engine</dt><dd>the engine row the backend's metrics are read with (auto: not detected yet), and its labels from config (gpu=...)</dd>
<dt>queued, running, KV use</dt><dd>from the backend's own metrics page; - when unknown, stale when too old to trust</dd>
<dt>in flight, requests, failures</dt><dd>counted by llmlb: sent and not finished, sent since start, answered with a connect failure or a 5xx</dd>
<dt>ejections</dt><dd>times passive health took the backend out of rotation: one refused connection, failed requests in a row (other connect failures, 5xx, 429, streams timed out, stalled, cut or ended before their terminator) or a time to first token far beyond the fleet's</dd>
<dt>TTFT, prefix hits</dt><dd>smoothed time to first byte; share of prompt tokens the backend reported served from its cache</dd>
<dt>est/obs, est/rep</dt><dd>the picks' estimates against what came, summed since start: time to first token of the streams the first chosen backend answered (from sending), and cached prompt tokens against those the backend reported; 1.00 is right, below it the estimate is short</dd>
<dt>LoRA</dt><dd>adapters running / waiting / max</dd>
</dl>
<h2>Picks by reason</h2>
<table id="reasons"><tr><th class="l">reason</th><th>picks</th></tr>
{{range .Reasons}}<tr><td class="l">{{.Reason}}</td><td>{{.N}}</td></tr>{{else}}<tr><td class="l" colspan="2">none yet</td></tr>{{end}}
</table>
<h2>Recent requests</h2>
<table id="recent"><tr><th class="l">time</th><th class="l">request id</th><th class="l">model</th><th class="l">backend</th><th class="l">reason</th><th>status</th><th>TTFT</th><th>duration</th></tr>
{{range .Recent}}<tr><td class="l">{{.At.Format "15:04:05.000"}}</td><td class="l">{{.ID}}</td><td class="l wrap">{{.Model}}</td><td class="l">{{if .BackendName}}{{.BackendName}}{{else}}{{.Backend}}{{end}}</td><td class="l">{{.Reason}}</td><td>{{.Status}}</td><td>{{if .TTFT}}{{ms .TTFT}}{{else}}-{{end}}</td><td>{{ms .Duration}}</td></tr>
{{else}}<tr><td class="l" colspan="8">none yet</td></tr>{{end}}
</table>
<p class="sub">JSON: <a href="/debug/backends">/debug/backends</a> · metrics: <a href="/metrics">/metrics</a></p>
</body></html>
`))

func fmtMS(d time.Duration) string {
	if d < time.Millisecond {
		return "<1ms"
	}
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}

// serveStatus renders the admin status page.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	snap := s.bal.Snapshot()
	recent, reasons, hit := s.picks.view()
	data := struct {
		Policy, Uptime, Now string
		Fleet               string // the fleet state's health; "" for an llmlb alone
		Ready, Queue        int
		Rows                []statusRow
		Reasons             []reasonCount
		Recent              []pickEntry
	}{Policy: s.bal.Policy(), Uptime: time.Since(s.started).Round(time.Second).String(),
		Now: time.Now().Format(time.DateTime), Queue: s.bal.QueueLen(), Reasons: reasons, Recent: recent}
	switch {
	case s.fleet == nil:
	case s.fleet.Up():
		data.Fleet = "fleet state in Redis"
	default:
		data.Fleet = "Redis down: limits and sessions this replica's own"
	}
	for _, be := range snap.Backends {
		if be.State == balancer.StateReady {
			data.Ready++
		}
		ej := be.Ledger.Ejection()
		row := statusRow{Name: be.Name, ID: be.ID, Addr: strings.TrimPrefix(be.ID, "http://"), Engine: be.Engine, Labels: labelText(be.Labels), State: be.State.String(), Reason: be.Reason, Warning: be.Warning,
			Stale: be.Stale, InFlight: be.Ledger.InFlight(), Requests: be.Ledger.Total(), Failures: be.Ledger.Failures(), Ejections: ej.Total,
			Queued: "-", Running: "-", KV: "-", TTFT: "-", HitRate: "-", LoRA: "-"}
		row.TTFTEst, row.CachedEst = s.picks.estimates(be.ID)
		if be.Role != balancer.RoleBoth {
			row.Role = be.Role.String()
		}
		if ej.Ejected {
			row.State, row.Reason = "ejected", ej.Reason // out of rotation whatever its health check says
		}
		m := be.Metrics
		if !m.At.IsZero() {
			if m.Queued.Known {
				row.Queued = fmt.Sprint(m.Queued.V)
			}
			if m.Running.Known {
				row.Running = fmt.Sprint(m.Running.V)
			}
			if m.KVUsage.Known {
				row.KV = fmt.Sprintf("%.0f%%", 100*m.KVUsage.V)
			}
			if l := m.LoRA; l != nil {
				row.LoRA = fmt.Sprintf("%s / %s / %d", listOrDash(l.Running), listOrDash(l.Waiting), l.Max)
			}
		}
		if d := be.Ledger.TTFB(); d > 0 {
			row.TTFT = fmtMS(d)
		}
		if h, ok := hit[be.ID]; ok {
			row.HitRate = fmt.Sprintf("%.0f%%", 100*h)
		}
		names := slices.Clone(be.Models)
		for _, a := range be.Adapters {
			names = append(names, a.Name)
		}
		row.Models = names
		data.Rows = append(data.Rows, row)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusPage.Execute(w, data); err != nil {
		s.logger.Warn("status page", "err", err)
	}
}

// labelText renders a backend's labels as k=v pairs sorted by key.
func labelText(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, " ")
}

func listOrDash(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ", ")
}
