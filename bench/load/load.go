package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// Load generators (hey for one URL, vegeta for a targets file) and the
// ABBA rounds of an edge-versus-plain comparison.

// loadResult is one run of a load generator.
type loadResult struct {
	rps      float64     // requests answered (any status) per second of the run
	codes    map[int]int // HTTP status → responses
	errors   int         // requests without an HTTP answer
	requests int         // all requests sent
}

// A side is one server of a comparison and how to load it.
type side struct {
	proc  *proc
	admin int // its admin port, for -pprof; 0 for none
	// prepare, if set, runs before each load run, outside the measured
	// window (e.g. writing a fresh targets file).
	prepare func() error
	load    func(d time.Duration) (loadResult, error)
	// cpu, if set, is the side's CPU time in seconds (nginx: master and
	// workers); procCPU of proc otherwise.
	cpu func() (float64, error)
}

// cpuTime is the CPU time the side's server has used, in seconds.
func (s side) cpuTime() (float64, error) {
	if s.cpu != nil {
		return s.cpu()
	}
	return procCPU(s.proc.pid())
}

// pair is an edge-versus-plain comparison measured in ABBA rounds: the
// sides alternate (edge first in even rounds, plain first in odd ones),
// and medians of requests/s and of server CPU per request are reported.
type pair struct {
	id     string  // short id, in logs, raw rounds and profile names
	name   string  // the row label of the report
	want   int     // the status every response must have
	target float64 // minimum edge/plain ratio of medians; 0 for none
	// tool is the load command, for the report.
	tool        string
	edge, plain side
	// peers are more servers measured in the same rounds (nginx, Go's
	// floor), each against the edge.
	peers []*peer

	edgeRPS, plainRPS []float64
	edgeCPU, plainCPU []float64 // server CPU µs per request
	bad               int       // responses with another status, or errors
	maxRequests       int       // the most requests one run sent
}

// peer is a further server of a pair: its name in the report, a minimum
// edge/peer ratio of requests/s (0 for none), and its rounds.
type peer struct {
	name   string
	note   string // what it is, for the report
	side   side
	target float64
	rps    []float64
	cpu    []float64 // server CPU µs per request
}

// Sides of a pair, in the order of even rounds (odd rounds reverse it):
// edge, plain, then the peers (sidePeer+i).
const (
	sideEdge = iota
	sidePlain
	sidePeer
)

// sides is the order of p's sides in even rounds.
func (p *pair) sides() []int {
	s := []int{sideEdge, sidePlain}
	for i := range p.peers {
		s = append(s, sidePeer+i)
	}
	return s
}

func (p *pair) side(which int) (side, string) {
	switch which {
	case sideEdge:
		return p.edge, "edge"
	case sidePlain:
		return p.plain, "plain"
	}
	pe := p.peers[which-sidePeer]
	return pe.side, pe.name
}

// abba warms every side up for 1 s, then runs rounds rounds over pairs.
func abba(pairs []*pair, rounds int) error {
	log.Printf("warm-up")
	for _, p := range pairs {
		for _, which := range p.sides() {
			s, _ := p.side(which)
			if s.prepare != nil {
				if err := s.prepare(); err != nil {
					return err
				}
			}
			if _, err := s.load(time.Second); err != nil {
				return err
			}
		}
	}
	for round := 0; round < rounds; round++ {
		for _, p := range pairs {
			order := p.sides() // edge first
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, which := range order {
				if err := p.once(round, which); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// once is one measured run of one side of p.
func (p *pair) once(round int, which int) error {
	s, sideName := p.side(which)
	if s.prepare != nil {
		if err := s.prepare(); err != nil {
			return err
		}
	}
	var prof chan error
	if round == 0 && *flagPprof != "" && s.admin != 0 {
		prof = make(chan error, 1)
		go func() {
			prof <- saveProfile(s.admin, *flagDur-time.Second, filepath.Join(*flagPprof, p.id+"-"+sideName+".pprof"))
		}()
	}
	cpu0, err := s.cpuTime()
	if err != nil {
		return err
	}
	r, err := s.load(*flagDur)
	if err != nil {
		return err
	}
	cpu1, err := s.cpuTime()
	if err != nil {
		return err
	}
	if prof != nil {
		if err := <-prof; err != nil {
			log.Printf("pprof: %v", err)
		}
	}
	answered := 0
	for _, n := range r.codes {
		answered += n
	}
	cpuPer := 0.0
	if answered > 0 {
		cpuPer = (cpu1 - cpu0) / float64(answered) * 1e6
	}
	p.bad += r.errors
	for code, n := range r.codes {
		if code != p.want {
			p.bad += n
		}
	}
	p.maxRequests = max(p.maxRequests, r.requests)
	switch which {
	case sideEdge:
		p.edgeRPS = append(p.edgeRPS, r.rps)
		p.edgeCPU = append(p.edgeCPU, cpuPer)
	case sidePlain:
		p.plainRPS = append(p.plainRPS, r.rps)
		p.plainCPU = append(p.plainCPU, cpuPer)
	default:
		pe := p.peers[which-sidePeer]
		pe.rps = append(pe.rps, r.rps)
		pe.cpu = append(pe.cpu, cpuPer)
	}
	log.Printf("round %d %s %s: %.0f req/s, %.1f µs server CPU per request, %d requests", round+1, p.id, sideName, r.rps, cpuPer, r.requests)
	return nil
}

// saveProfile fetches a CPU profile of the Caddy whose admin is on port.
func saveProfile(admin int, d time.Duration, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", admin, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// ---- hey: one URL ----------------------------------------------------------

var (
	rpsRe    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	codeRe   = regexp.MustCompile(`\[(\d{3})\]\s+(\d+) responses`)
	errDistR = regexp.MustCompile(`(?m)^\s+\[(\d+)\]\s+Get `)
)

// heyArgs: extra (e.g. -H headers) go before the URL.
func heyArgs(dur time.Duration, u string, extra ...string) []string {
	args := []string{"-z", dur.String(), "-c", strconv.Itoa(*flagConc), "-disable-redirects", "-disable-compression"}
	return append(append(args, extra...), u)
}

// heyLoad loads u with hey for d, with extra hey arguments.
func heyLoad(u string, extra ...string) func(d time.Duration) (loadResult, error) {
	return func(d time.Duration) (loadResult, error) {
		name, args := pinned(loadCPUs(), *flagHey, heyArgs(d, u, extra...))
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return loadResult{}, fmt.Errorf("hey: %w: %s", err, out)
		}
		m := rpsRe.FindSubmatch(out)
		if m == nil {
			return loadResult{}, fmt.Errorf("hey: no Requests/sec in output: %s", out)
		}
		r := loadResult{codes: map[int]int{}}
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
		for _, cm := range codeRe.FindAllSubmatch(out, -1) {
			code, _ := strconv.Atoi(string(cm[1]))
			n, _ := strconv.Atoi(string(cm[2]))
			r.codes[code] += n
			r.requests += n
		}
		for _, em := range errDistR.FindAllSubmatch(out, -1) {
			n, _ := strconv.Atoi(string(em[1]))
			r.errors += n
			r.requests += n
		}
		return r, nil
	}
}

// ---- vegeta: a targets file ------------------------------------------------

// vegetaAttackArgs: as many requests as *flagConc workers can send, no
// redirect followed (-redirects -1: the 302 itself is the response,
// counted as a success), connections kept alive.
func vegetaAttackArgs(targets string, d time.Duration) []string {
	c := strconv.Itoa(*flagConc)
	return []string{"attack", "-targets", targets, "-rate", "0", "-max-workers", c, "-workers", c,
		"-duration", d.String(), "-redirects", "-1", "-keepalive"}
}

// vegetaLoad loads the targets in the file at path with vegeta for d.
// vegeta cycles through the file when a run sends more requests than it
// holds; pair.maxRequests against the file's size tells whether it did.
func vegetaLoad(path string) func(d time.Duration) (loadResult, error) {
	return func(d time.Duration) (loadResult, error) {
		results := path + ".results"
		name, args := pinned(loadCPUs(), *flagVegeta, append(vegetaAttackArgs(path, d), "-output", results))
		attack := exec.Command(name, args...)
		if out, err := attack.CombinedOutput(); err != nil {
			return loadResult{}, fmt.Errorf("vegeta attack: %w: %s", err, out)
		}
		out, err := exec.Command(*flagVegeta, "report", "-type", "json", results).Output()
		if err != nil {
			return loadResult{}, fmt.Errorf("vegeta report: %w", err)
		}
		os.Remove(results)
		var rep struct {
			Requests    int            `json:"requests"`
			Duration    int64          `json:"duration"` // ns, first to last request sent
			Wait        int64          `json:"wait"`     // ns, last request sent to its response
			StatusCodes map[string]int `json:"status_codes"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			return loadResult{}, fmt.Errorf("vegeta report: %w: %s", err, out)
		}
		r := loadResult{codes: map[int]int{}, requests: rep.Requests}
		for k, n := range rep.StatusCodes {
			code, err := strconv.Atoi(k)
			if err != nil {
				return loadResult{}, fmt.Errorf("vegeta report: status %q", k)
			}
			if code == 0 { // vegeta's code for no HTTP answer
				r.errors += n
				continue
			}
			r.codes[code] += n
		}
		if el := time.Duration(rep.Duration + rep.Wait); el > 0 {
			// As hey's Requests/sec: answered requests over the whole run.
			r.rps = float64(rep.Requests-r.errors) / el.Seconds()
		}
		return r, nil
	}
}
