// Command load is the side-by-side load benchmark behind `make bench`. It
// builds nothing (make built bin/caddy, bin/caddy-plain and installed
// versitygw, hey and vegeta) and measures, in one run on this machine,
// over loopback only, the scenarios listed in scenarios below:
//
//	(a) serve: the edge serving a 256 KiB segment from SQLite (warm cache)
//	    against stock Caddy's file_server serving the same bytes from disk
//	    (hey, one URL), with nginx (nginx.go: sendfile, an MD5 secure link
//	    per request) and Go's floor (floor.go: net/http writing the bytes
//	    from memory in one Write) as peers in the same rounds;
//	(b) redirect: the edge's 302 to a presigned S3 URL (record cached),
//	    configured as in production (audience hmac_sha256, INFO log), every
//	    request with its own token (vegeta, a targets file of distinct
//	    signed URLs), against a stock Caddy `redir` of a URL of the same
//	    length driven by the same kind of targets; beside it the same edge
//	    with `audience template`;
//	(c) storm: 200 concurrent clients downloading one 8 MiB segment in
//	    proxy mode from a real S3 server (versitygw): bytes checked, object
//	    requests counted in versitygw's access log, the edge's peak RSS
//	    (VmHWM); once with the default cache and once with the bytes cache
//	    off, as a control;
//	(d) forged: 2,000 requests with forged tokens, counting the store
//	    requests they caused (versitygw access log; the edge's
//	    caddy_syncular_store_duration_seconds counts for SQLite);
//	(e)–(h) large segments through the disk tier (large.go): a crowd on a
//	    64 MiB segment cold and warm against file_server and nginx, slow readers,
//	    time to first byte of fill followers, the disk tier after a restart.
//	(i) compress: bytes on the wire per download (identity, gzip, zstd)
//	    of a 50,000-row SQLite image and rows segment, encode time, and a
//	    zstd cache hit against an identity cache hit (256 KiB, 8 MiB).
//	(j) outage: versitygw frozen (SIGSTOP) for -outage (60 s) under load:
//	    answers by kind (segments the edge holds, segments it never read)
//	    and phase, with the default grace and with grace 0.
//	(k) writer: a sync-server writer without a busy timeout committing
//	    every 20 ms beside 100 cold clients on 8 segments (one of 24 MiB):
//	    its failed commits and the share of time the edge held a read
//	    lock, in a rollback journal and in WAL.
//	(l) compress storm: 100 clients arriving together on a cold edge for a
//	    compressible 64 MiB SQLite image (every encoding, then gzip only):
//	    bytes on the wire against identity, store reads, first bytes.
//	(m) fair: tenant B's downloads while tenant A's 400 clients ask for
//	    distinct cold segments, against B alone (the store-work gate).
//	(n) stalled: 300 connections that request the 64 MiB SQLite segment
//	    with the disk tier off and never read: the edge's RSS while they
//	    stall and after they close.
//
// (a) and (b) alternate edge and plain runs (ABBA order) over several
// rounds and report medians and ratios, of requests/s and of the serving
// process's CPU time per request: absolute numbers on shared machines
// drift. The report is printed as Markdown and, with -o, written to a file
// (bench/RESULTS.md). -only runs a subset (e.g. `-only b`).
//
// Files: main.go (flags, the scenario list, the run), proc.go (processes
// and /proc readers), setup.go (stores, segments, tokens, Caddy configs),
// load.go (hey, vegeta and the ABBA rounds), scenario_*.go (one scenario
// each), report.go (the Markdown report).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

var (
	flagCaddy   = flag.String("caddy", "bin/caddy", "Caddy with this module")
	flagPlain   = flag.String("plain", "bin/caddy-plain", "stock Caddy of the same version")
	flagGW      = flag.String("versitygw", ".tools/bin/versitygw", "versitygw binary")
	flagHey     = flag.String("hey", ".tools/bin/hey", "hey binary (scenario a)")
	flagVegeta  = flag.String("vegeta", ".tools/bin/vegeta", "vegeta binary (scenario b)")
	flagRounds  = flag.Int("rounds", 7, "ABBA rounds of the side-by-side scenarios")
	flagDur     = flag.Duration("dur", 4*time.Second, "length of one load run")
	flagConc    = flag.Int("c", 32, "load generator concurrency (hey -c, vegeta -workers and -max-workers)")
	flagTargets = flag.Int("targets", 100000, "distinct signed URLs per vegeta run in (b); more than one run sends, so no token repeats")
	flagClients = flag.Int("clients", 200, "concurrent clients in (c)")
	flagForged  = flag.Int("forged", 2000, "forged-token requests in (d)")
	flagOnly    = flag.String("only", "", "comma-separated scenario ids to run (e.g. \"b\" or \"a,b\"); empty runs all")
	flagOut     = flag.String("o", "", "also write the Markdown report to this file")
	flagPin     = flag.String("pin", "", "run the Caddy processes and the load generators on separate CPUs, as \"<server cpus>:<load cpus>\" (taskset -c lists, e.g. \"1:0\"); empty: no pinning")
	flagPprof   = flag.String("pprof", "", "save CPU profiles of both sides during the first round of the side-by-side scenarios into this directory")
	flagBase    = flag.String("caddy-base", "", "another build of the edge (e.g. main's bin/caddy, copied aside): (a) and (b) run it too, with the same config, as a peer of the edge in the same rounds, so the edge ÷ base ratios compare two builds under the same load")
)

// A scenario is one measurement of the report. To add one, write
// scenario_<name>.go with a function of the run type (start what it needs
// with e.startCaddy, which stops with the run; put its results on the
// report: rep.pairs for edge-versus-plain rounds via abba, or
// rep.addSection for anything else) and add a line to scenarios.
type scenario struct {
	id   string // its letter in the report and in -only
	what string
	run  func(e *env, rep *report) error
}

var scenarios = []scenario{
	{"a", "serve 256 KiB from SQLite vs file_server and nginx", serveScenario},
	{"b", "redirect (hmac_sha256 and template audience, distinct tokens) vs redir", redirectScenario},
	{"c", "storm: concurrent clients, one segment, proxy mode", stormScenario},
	{"d", "forged tokens: store requests caused", forgedScenario},
	{"e", "200 clients, one 64 MiB segment, disk tier cold and warm vs file_server and nginx", largeStormScenario},
	{"f", "100 slow readers of a 64 MiB segment: RSS and fds", slowScenario},
	{"g", "time to first byte of fill followers vs the leader", ttfbScenario},
	{"h", "restart: the disk tier serves without store reads", restartScenario},
	{"i", "compressed delivery: bytes on the wire, encode time, compressed vs identity cache hits", compressScenario},
	{"j", "store outage: answers by kind through a frozen store (grace, breaker)", outageScenario},
	{"k", "a busy-handler-free writer beside a cold storm: failed commits and read-lock share, rollback journal and WAL", writerScenario},
	{"l", "100 clients arriving together on a cold edge for a compressible 64 MiB SQLite image: wire bytes, store reads, first byte", compressStormScenario},
	{"m", "fair store work: tenant B's downloads while tenant A's clients ask for 400 distinct cold segments", fairScenario},
	{"n", "stalled readers: RSS of 300 connections that never read a streamed segment (disk off)", stalledScenario},
}

// selected returns the scenarios -only names, in list order.
func selected() ([]scenario, error) {
	if *flagOnly == "" {
		return scenarios, nil
	}
	want := strings.Split(*flagOnly, ",")
	for i := range want {
		want[i] = strings.TrimSpace(want[i])
	}
	var out []scenario
	for _, s := range scenarios {
		if slices.Contains(want, s.id) {
			out = append(out, s)
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(scenarios, func(s scenario) bool { return s.id == w }) {
			var ids []string
			for _, s := range scenarios {
				ids = append(ids, s.id+" ("+s.what+")")
			}
			return nil, fmt.Errorf("-only: unknown scenario %q (have %s)", w, strings.Join(ids, ", "))
		}
	}
	return out, nil
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	if *flagFloor != "" {
		if err := floorServe(*flagFloor, *flagFloorAddr); err != nil {
			log.Fatalf("bench: floor: %v", err)
		}
		return
	}
	if err := pinSelf(); err != nil {
		log.Fatalf("bench: %v", err)
	}
	if *flagFairStorm != "" {
		if err := fairStormChild(*flagFairStorm); err != nil {
			log.Fatalf("bench: storm child: %v", err)
		}
		return
	}
	if err := run(); err != nil {
		cleanup()
		log.Fatalf("bench: %v", err)
	}
	cleanup()
}

func run() error {
	todo, err := selected()
	if err != nil {
		return err
	}
	for _, p := range []string{*flagCaddy, *flagPlain, *flagGW, *flagHey, *flagVegeta} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing (run `make bench`, which builds and installs it): %w", p, err)
		}
	}
	if needsNginx(todo) {
		if _, err := nginxBinary(); err != nil {
			return err
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; cleanup(); os.Exit(130) }()

	dir, err := os.MkdirTemp("", "syncular-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	began := time.Now()
	e, err := newEnv(dir)
	if err != nil {
		return err
	}
	defer e.close()

	rep := &report{began: began, loadBefore: loadAvg()}
	for _, s := range todo {
		log.Printf("scenario (%s): %s", s.id, s.what)
		rep.ran = append(rep.ran, s)
		if err := s.run(e, rep); err != nil {
			return fmt.Errorf("scenario (%s): %w", s.id, err)
		}
		cleanup() // the scenario's Caddy processes
	}
	rep.took = time.Since(began)
	rep.loadAfter = loadAvg()
	md := rep.markdown()
	fmt.Print(md)
	if *flagOut != "" {
		// Hand-written notes below the marker survive a new run.
		if old, err := os.ReadFile(*flagOut); err == nil {
			if i := bytes.Index(old, []byte(notesMarker)); i >= 0 {
				md += "\n" + string(old[i:])
			}
		}
		if err := os.WriteFile(*flagOut, []byte(md), 0o644); err != nil {
			return err
		}
		log.Printf("wrote %s", *flagOut)
	}
	return nil
}
