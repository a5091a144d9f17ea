package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report is what a run found: the machine, the edge-versus-plain pairs,
// and a Markdown section per other scenario.
type report struct {
	loadBefore string
	loadAfter  string
	began      time.Time
	took       time.Duration
	ran        []scenario
	pairs      []*pair
	sections   []func(w func(string, ...any))
}

// addSection appends a scenario's own part of the report (a "## ..."
// heading and its body), printed after the side-by-side tables.
func (r *report) addSection(s func(w func(string, ...any))) {
	r.sections = append(r.sections, s)
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("# Benchmark results\n\n")
	cmd := "`make bench` (`go run ./bench/load -o bench/RESULTS.md`)"
	if *flagOnly != "" {
		cmd = fmt.Sprintf("`go run ./bench/load -only %s`", *flagOnly)
	}
	var ran []string
	for _, s := range r.ran {
		ran = append(ran, "("+s.id+")")
	}
	w("Produced by %s; scenarios %s; every number below is from one run.\n\n", cmd, strings.Join(ran, ", "))
	w("## Machine\n\n")
	w("- date: %s (run took %s)\n", r.began.UTC().Format(time.RFC3339), r.took.Round(time.Second))
	w("- `nproc`: %s; CPU: %s\n", cmdOut("nproc"), cpuModel())
	w("- `free -h`:\n\n```\n%s\n```\n\n", strings.TrimLeft(cmdOut("free", "-h"), "\n"))
	w("- load average (1, 5, 15 min) before the run: %s; after: %s (the machine is shared: other jobs run beside the benchmark, which is why sides alternate and medians are reported)\n", r.loadBefore, r.loadAfter)
	w("- kernel %s, %s, Caddy %s\n\n", cmdOut("uname", "-r"), runtime.Version(), firstLine(cmdOut(*flagPlain, "version")))
	if len(r.pairs) > 0 {
		r.pairsMarkdown(w)
	}
	for _, s := range r.sections {
		s(w)
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

// targetCell is the target cell of a ratio (higher is better): "—" without
// a target.
func targetCell(ratio, target float64) string {
	if target <= 0 {
		return "—"
	}
	v := "met"
	if ratio < target {
		v = "**missed**"
	}
	return fmt.Sprintf("≥ %.2f× (%s)", target, v)
}

func (r *report) pairsMarkdown(w func(string, ...any)) {
	w("## Commands\n\n")
	seen := map[string]bool{}
	for _, p := range r.pairs {
		if !seen[p.tool] {
			seen[p.tool] = true
			w("- (%s) load: %s, concurrency %d, %d rounds of %s per side, edge and plain alternated (ABBA), after a 1 s warm-up of every side\n",
				p.id, p.tool, *flagConc, *flagRounds, *flagDur)
		}
	}
	w("- edge: `bin/caddy run --config <scenario>-edge.Caddyfile` (this module); plain: `bin/caddy-plain run --config <scenario>-plain.Caddyfile` (stock Caddy, same version); both on 127.0.0.1, same URL path and query shape on both sides, global `log { level INFO }`\n")
	if *flagPin != "" {
		w("- CPUs: every Caddy on CPU %s, the load generator on CPU %s (`taskset -c`, `-pin %s`); Go sizes GOMAXPROCS to the CPUs it may use\n", serverCPUs(), loadCPUs(), *flagPin)
	} else {
		w("- CPUs: not pinned: servers and load generator share every CPU\n")
	}
	w("- keys: segment key and audience key 32 random bytes each (`hex:`, from environment variables)\n")
	w("- S3: versitygw posix backend on 127.0.0.1 (started by `internal/s3test`), its access log counted per object key\n\n")

	w("## Throughput (requests/s, median of %d rounds)\n\n", *flagRounds)
	w("| measurement | edge | plain | ratio (of medians) | median of per-round ratios | target | other answers |\n|---|---:|---:|---:|---:|---|---:|\n")
	for _, p := range r.pairs {
		me, mp := median(p.edgeRPS), median(p.plainRPS)
		var ratios []float64
		for j := range min(len(p.edgeRPS), len(p.plainRPS)) {
			ratios = append(ratios, p.edgeRPS[j]/p.plainRPS[j])
		}
		ratio := me / mp
		w("| %s | %.0f | %.0f | **%.2f×** | %.2f× | %s | %d |\n", p.name, me, mp, ratio, median(ratios), targetCell(ratio, p.target), p.bad)
	}
	w("\n### Server CPU per request (µs, median of %d rounds)\n\n", *flagRounds)
	w("CPU time (user + system, from `/proc/<pid>/stat`) the serving Caddy process spent during a run, divided by the requests answered in it. Less sensitive to other jobs on the machine than throughput; the ratio is plain ÷ edge, so like the throughput ratio, higher is better for the edge.\n\n")
	w("| measurement | edge µs/req | plain µs/req | ratio plain/edge (of medians) | median of per-round ratios | target |\n|---|---:|---:|---:|---:|---|\n")
	for _, p := range r.pairs {
		me, mp := median(p.edgeCPU), median(p.plainCPU)
		var ratios []float64
		for j := range min(len(p.edgeCPU), len(p.plainCPU)) {
			if p.edgeCPU[j] > 0 {
				ratios = append(ratios, p.plainCPU[j]/p.edgeCPU[j])
			}
		}
		w("| %s | %.1f | %.1f | **%.2f×** | %.2f× | %s |\n", p.name, me, mp, mp/me, median(ratios), targetCell(mp/me, p.target))
	}
	r.peersMarkdown(w)
	w("\nRaw rounds (req/s):\n\n")
	for _, p := range r.pairs {
		w("- %s: edge %s; plain %s\n", p.id, fmtList(p.edgeRPS, 0), fmtList(p.plainRPS, 0))
		w("  - server CPU µs/request: edge %s; plain %s\n", fmtList(p.edgeCPU, 1), fmtList(p.plainCPU, 1))
		for _, pe := range p.peers {
			w("  - %s: %s req/s; server CPU µs/request %s\n", pe.name, fmtList(pe.rps, 0), fmtList(pe.cpu, 1))
		}
		if strings.Contains(p.tool, "vegeta") {
			repeat := "no token was sent twice"
			if p.maxRequests > *flagTargets {
				repeat = "**more than the file holds: vegeta cycled, some tokens were sent twice**"
			}
			w("  - most requests in one run: %d, against %d distinct tokens per run: %s\n", p.maxRequests, *flagTargets, repeat)
		}
	}
	w("\n")
}

// peersMarkdown is the table of the pairs measured against peers too
// (nginx, Go's floor): one row per pair and peer.
func (r *report) peersMarkdown(w func(string, ...any)) {
	var rows []*pair
	for _, p := range r.pairs {
		if len(p.peers) > 0 {
			rows = append(rows, p)
		}
	}
	if len(rows) == 0 {
		return
	}
	w("\n### Against nginx and the floors (median of %d rounds)\n\n", *flagRounds)
	w("Each peer runs in the same rounds as the edge and plain Caddy (edge, plain, then the peers; reversed every other round), with the same bytes. Requests/s ratio edge ÷ peer (higher is better for the edge); CPU ratio edge ÷ peer (lower is better for the edge). The peers:\n\n")
	seen := map[string]bool{}
	for _, p := range rows {
		for _, pe := range p.peers {
			if !seen[pe.name] {
				seen[pe.name] = true
				w("- **%s**: %s\n", pe.name, pe.note)
			}
		}
	}
	w("\n| measurement | peer | edge req/s | peer req/s | edge ÷ peer (of medians) | median of per-round ratios | target | edge µs/req | peer µs/req | CPU edge ÷ peer (of medians) | median of per-round ratios |\n|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n")
	for _, p := range rows {
		for _, pe := range p.peers {
			me, mn := median(p.edgeRPS), median(pe.rps)
			ce, cn := median(p.edgeCPU), median(pe.cpu)
			var rr, cr []float64
			for j := range min(len(p.edgeRPS), len(pe.rps)) {
				rr = append(rr, p.edgeRPS[j]/pe.rps[j])
				if pe.cpu[j] > 0 {
					cr = append(cr, p.edgeCPU[j]/pe.cpu[j])
				}
			}
			w("| %s | %s | %.0f | %.0f | **%.2f×** | %.2f× | %s | %.1f | %.1f | **%.2f×** | %.2f× |\n",
				p.name, pe.name, me, mn, me/mn, median(rr), targetCell(me/mn, pe.target), ce, cn, ce/cn, median(cr))
		}
	}
}

// nginxNote describes the nginx peer for the report.
func nginxNote() string {
	return fmt.Sprintf("%s, the same bytes from a file under the same path, `sendfile on`, an MD5 `secure_link` checked per request (`nginx -p <tmp>/ -c <tmp>/nginx.conf -e <tmp>/error.log`, `daemon off`, `worker_processes %s`, `access_log off`, `keepalive_requests 1000000`); its CPU is its master's and workers'", nginxVersion(), nginxWorkers())
}

// nginxVersion is "nginx/1.22.1" or the like.
func nginxVersion() string {
	bin, err := nginxBinary()
	if err != nil {
		return "nginx"
	}
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	v := strings.TrimSpace(string(out))
	if _, after, ok := strings.Cut(v, "version: "); ok {
		v = after
	}
	return "`" + v + "`"
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strings.TrimRight(string(out), "\n ")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown"
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	if f := strings.Fields(l); len(f) > 0 {
		return f[0]
	}
	return l
}

func fmtList(xs []float64, prec int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf("%.*f", prec, x))
	}
	return strings.Join(s, ", ")
}

func fmtCodes(m map[int]int) string {
	var keys []int
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%d × %d", m[k], k))
	}
	return strings.Join(s, ", ")
}
