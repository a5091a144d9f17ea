package main

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// largeRound is one round of (e) for one backend: a fresh edge (empty
// disk directory) answers the crowd cold (its clients trigger the fill),
// then warm (the segment on disk); file_server answers the same crowd.
type largeRound struct {
	cold, warm, plain *crowd
	nginx             *crowd
	// server CPU per answered client, ms: the edge cold and warm,
	// file_server, nginx (master and workers)
	cpuCold, cpuWarm, cpuPlain, cpuNginx float64
	coldReads, warmReads                 int
	rssIdle, rssPeak                     int64 // KiB
	rssPeakCold                          int64 // KiB, VmHWM after the cold crowd
	coldRatio, warmRatio                 float64
}

type largeStormResult struct {
	backend string
	rounds  []*largeRound
}

// largeStormScenario is (e): *flagClients concurrent clients, each with
// its own token, download one 64 MiB segment through the disk tier, from
// SQLite (`serve`) and S3 (`proxy`), against stock Caddy's file_server
// serving the same file to the same crowd; sides alternate per round.
func largeStormScenario(e *env, rep *report) error {
	l, err := e.large()
	if err != nil {
		return err
	}
	plainPort := freePort()
	plain, err := e.startCaddy("large-plain", *flagPlain, fmt.Sprintf(globalOpts, freePort())+fmt.Sprintf(`
http://127.0.0.1:%d {
	root * %s
	file_server
}
`, plainPort, l.www))
	if err != nil {
		return err
	}
	defer plain.stop()
	tok := e.token(l.id, time.Now().Add(time.Hour))
	if err := waitHTTP(plain, segURL(plainPort, l.id, tok)); err != nil {
		return err
	}
	plainURL := func(i int) string {
		return segURL(plainPort, l.id, e.token(l.id, time.Now().Add(time.Hour+time.Duration(i)*time.Second)))
	}
	ngx, err := e.startNginx("large-nginx", l.www)
	if err != nil {
		return err
	}
	defer ngx.stop()
	if err := checkNginx(ngx, l.id, plainURL(0)); err != nil {
		return err
	}
	ngxURL := func(i int) string { return ngx.url(l.id, time.Now().Add(time.Hour+time.Duration(i)*time.Second)) }
	plainCPU := func() (float64, error) { return procCPU(plain.pid()) }
	var results []*largeStormResult
	for _, b := range largeBackends {
		if !slices.Contains(strings.Split(*flagLargeBackends, ","), b) {
			continue
		}
		res := &largeStormResult{backend: b}
		for r := range *flagLargeRounds {
			rd := &largeRound{}
			runPlain := func() error {
				var err error
				if rd.plain, rd.cpuPlain, err = cpuCrowd(plainCPU, plainURL, l.bytes); err != nil {
					return fmt.Errorf("file_server: %w", err)
				}
				if rd.nginx, rd.cpuNginx, err = cpuCrowd(ngx.cpu, ngxURL, l.bytes); err != nil {
					return fmt.Errorf("nginx: %w", err)
				}
				return nil
			}
			if r%2 == 0 {
				if err := runPlain(); err != nil {
					return err
				}
			}
			name := fmt.Sprintf("large-%s-%d", b, r)
			edge, err := e.startLargeEdge(name, b, filepath.Join(e.dir, name+"-disk"))
			if err != nil {
				return err
			}
			rd.rssIdle, _ = procStatus(edge.pid(), "VmRSS")
			reads0 := edge.storeReads()
			edgeCPU := func() (float64, error) { return procCPU(edge.pid()) }
			prof := crowdProfiles(edge.admin, name+"-cold")
			if rd.cold, rd.cpuCold, err = cpuCrowd(edgeCPU, edge.url, l.bytes); err != nil {
				return fmt.Errorf("%s cold: %w", name, err)
			}
			if err := prof(); err != nil {
				log.Printf("(e) %s cold: pprof: %v", name, err)
			}
			rd.rssPeakCold, _ = procStatus(edge.pid(), "VmHWM")
			reads1 := edge.storeReads()
			prof = crowdProfiles(edge.admin, name+"-warm")
			if rd.warm, rd.cpuWarm, err = cpuCrowd(edgeCPU, edge.url, l.bytes); err != nil {
				return fmt.Errorf("%s warm: %w", name, err)
			}
			if err := prof(); err != nil {
				log.Printf("(e) %s warm: pprof: %v", name, err)
			}
			rd.coldReads, rd.warmReads = reads1-reads0, edge.storeReads()-reads1
			if rd.cold.ok+rd.warm.ok < 2*(*flagClients) {
				log.Printf("(e) %s: failed clients cold %v, warm %v", name, rd.cold.fails, rd.warm.fails)
				logWarnings(edge.proc, name)
			}
			rd.rssPeak, _ = procStatus(edge.pid(), "VmHWM")
			edge.stop()
			if r%2 == 1 {
				if err := runPlain(); err != nil {
					return err
				}
			}
			rd.coldRatio = rd.plain.took.Seconds() / rd.cold.took.Seconds()
			rd.warmRatio = rd.plain.took.Seconds() / rd.warm.took.Seconds()
			log.Printf("(e) %s round %d: plain %s (%d ok), nginx %s (%d ok), cold %s (%d ok, %d store reads), warm %s (%d ok, %d store reads), RSS idle %.1f MiB peak %.1f MiB (%.1f after the cold crowd) (first errors: %v / %v / %v / %v)",
				b, r+1, rd.plain.took.Round(time.Millisecond), rd.plain.ok, rd.nginx.took.Round(time.Millisecond), rd.nginx.ok,
				rd.cold.took.Round(time.Millisecond), rd.cold.ok, rd.coldReads,
				rd.warm.took.Round(time.Millisecond), rd.warm.ok, rd.warmReads, mib(rd.rssIdle), mib(rd.rssPeak), mib(rd.rssPeakCold),
				rd.plain.firstErr, rd.nginx.firstErr, rd.cold.firstErr, rd.warm.firstErr)
			log.Printf("(e) %s round %d: server CPU per answer: cold %.1f ms, warm %.1f ms, file_server %.1f ms, nginx %.1f ms; clients' CPU per answer: warm %.1f ms, nginx %.1f ms",
				b, r+1, rd.cpuCold, rd.cpuWarm, rd.cpuPlain, rd.cpuNginx, rd.warm.clientCPU, rd.nginx.clientCPU)
			res.rounds = append(res.rounds, rd)
		}
		results = append(results, res)
	}
	rep.addSection(func(w func(string, ...any)) { largeStormMarkdown(w, results) })
	return nil
}

// cpuCrowd is runCrowd of *flagClients clients on urlOf, and the
// server's CPU time (cpu) per answered client, in ms.
//
// It also records the clients' own CPU per answer (crowd.clientCPU, this
// process's CPU over the crowd). On loopback the kernel runs much of the
// receiving side's TCP work in the sender's context and the rest in the
// receiver's, and how it splits depends on the two sides' pacing: a
// server that sends sooner is charged more of it. The server's CPU alone
// is the target's measure; server plus clients is the work the answers
// cost the machine, which the report gives beside it.
func cpuCrowd(cpu func() (float64, error), urlOf func(int) string, want []byte) (*crowd, float64, error) {
	self := func() (float64, error) { return procCPU(os.Getpid()) }
	c0, err := cpu()
	if err != nil {
		return nil, 0, err
	}
	s0, err := self()
	if err != nil {
		return nil, 0, err
	}
	c, err := runCrowd(*flagClients, urlOf, want, 0, 0, nil)
	if err != nil {
		return c, 0, err
	}
	s1, err := self()
	if err != nil {
		return c, 0, err
	}
	c1, err := cpu()
	if err != nil {
		return c, 0, err
	}
	per := 0.0
	if c.ok > 0 {
		per = (c1 - c0) / float64(c.ok) * 1e3
		c.clientCPU = (s1 - s0) / float64(c.ok) * 1e3
	}
	return c, per, nil
}

// rps is the crowd's answered clients per second of its wall time.
func (c *crowd) rps() float64 {
	if c.took <= 0 {
		return 0
	}
	return float64(c.ok) / c.took.Seconds()
}

func largeStormMarkdown(w func(string, ...any), results []*largeStormResult) {
	w("## (e) %d concurrent clients, one 64 MiB segment, disk tier, against file_server\n\n", *flagClients)
	w("Every client has its own token and compares every byte it receives with the segment (a wrong byte stops the bench). Per round a fresh edge with an empty disk directory answers the crowd **cold** (these clients trigger the one fill) and then **warm** (the segment on disk); stock Caddy's `file_server` answers the same crowd for the same file; the plain run goes first in even rounds, last in odd ones. Ratio = file_server wall time / edge wall time (higher is better for the edge). Store reads of the bytes: S3, `s3_GetObject` lines of the object key in versitygw's access log; SQLite, `caddy_syncular_disk_fills_total` (one blob read each). RSS target: peak (VmHWM, whole edge life: cold and warm) ≤ idle + 64 MiB (`max_bytes`) + 32 MiB.\n\n")
	w("| backend | right bytes cold / warm / plain | store reads cold / warm | wall time cold (median) | warm (median) | file_server (median) | ratio cold (median of rounds) | ratio warm (median of rounds) | RSS idle → peak (max of rounds) |\n|---|---|---|---:|---:|---:|---|---|---|\n")
	for _, res := range results {
		var coldT, warmT, plainT, coldR, warmR []float64
		okC, okW, okP, n := 0, 0, 0, 0
		readsC, readsW := []int{}, []int{}
		var idle, peak int64
		rssOK := true
		for _, rd := range res.rounds {
			coldT = append(coldT, rd.cold.took.Seconds())
			warmT = append(warmT, rd.warm.took.Seconds())
			plainT = append(plainT, rd.plain.took.Seconds())
			coldR = append(coldR, rd.coldRatio)
			warmR = append(warmR, rd.warmRatio)
			okC, okW, okP, n = okC+rd.cold.ok, okW+rd.warm.ok, okP+rd.plain.ok, n+rd.cold.clients
			readsC, readsW = append(readsC, rd.coldReads), append(readsW, rd.warmReads)
			if rd.rssPeak-rd.rssIdle > peak-idle {
				idle, peak = rd.rssIdle, rd.rssPeak
			}
			rssOK = rssOK && rd.rssPeak <= rd.rssIdle+budgetKiB
		}
		w("| %s | %d / %d / %d of %d | %v / %v | %.2f s | %.2f s | %.2f s | **%.2f×** (target ≥ 0.8×: %s; rounds %s) | **%.2f×** (target ≥ 1.0×: %s; rounds %s) | %.1f → %.1f MiB (+%.1f; target ≤ +96: %s) |\n",
			backendName(res.backend), okC, okW, okP, n, readsC, readsW,
			median(coldT), median(warmT), median(plainT),
			median(coldR), verdict(median(coldR) >= 0.8), fmtList(coldR, 2),
			median(warmR), verdict(median(warmR) >= 1.0), fmtList(warmR, 2),
			mib(idle), mib(peak), mib(peak-idle), verdict(rssOK))
	}
	for _, res := range results {
		for i, rd := range res.rounds {
			for _, c := range []struct {
				what string
				c    *crowd
			}{{"cold", rd.cold}, {"warm", rd.warm}, {"file_server", rd.plain}} {
				if len(c.c.fails) > 0 {
					w("\n- %s round %d, %s: failed clients (not a wrong byte; a wrong byte stops the bench): %v", backendName(res.backend), i+1, c.what, c.c.fails)
				}
			}
		}
	}
	w("\nTarget: all clients right in every run, exactly one store read of the bytes per cold run and none warm.\n\n")
	largePeerMarkdown(w, results)
}

// largePeerMarkdown is (e)'s comparison of warm disk hits with nginx and
// file_server: answers per second of each crowd's wall time and the
// server's CPU per 64 MiB answer.
func largePeerMarkdown(w func(string, ...any), results []*largeStormResult) {
	w("### (e) warm disk hits against nginx and file_server\n\n")
	w("The same rounds: nginx (%s, `sendfile on`, an MD5 `secure_link` per request, each client its own link) answers the same crowd for the same file right after `file_server`. Requests/s = clients answered ÷ the crowd's wall time (on loopback the clients' own copy and byte check bound it); server CPU per answer = the server's CPU time (user + system; nginx's master and workers) over the crowd ÷ clients answered. Targets: edge warm CPU per answer ≤ 1.15× nginx's, requests/s within the rounds' spread of nginx's.\n\n", nginxVersion())
	w("| backend | req/s warm edge / nginx / file_server (medians) | edge ÷ nginx req/s (median of rounds; rounds) | CPU ms per answer warm edge / cold edge / nginx / file_server (medians) | CPU edge warm ÷ nginx (median of rounds; rounds) | CPU edge warm ÷ file_server (median of rounds) | server + clients CPU ms per answer, edge warm / nginx (medians) | server + clients, edge warm ÷ nginx (median of rounds; rounds) |\n|---|---|---|---|---|---|---|---|\n")
	for _, res := range results {
		var rw, rn, rp, rr, cw, cc, cn, cp, cr, cf, tw, tn, tr []float64
		for _, rd := range res.rounds {
			rw, rn, rp = append(rw, rd.warm.rps()), append(rn, rd.nginx.rps()), append(rp, rd.plain.rps())
			if rd.nginx.rps() > 0 {
				rr = append(rr, rd.warm.rps()/rd.nginx.rps())
			}
			cw, cc, cn, cp = append(cw, rd.cpuWarm), append(cc, rd.cpuCold), append(cn, rd.cpuNginx), append(cp, rd.cpuPlain)
			if rd.cpuNginx > 0 {
				cr = append(cr, rd.cpuWarm/rd.cpuNginx)
			}
			if rd.cpuPlain > 0 {
				cf = append(cf, rd.cpuWarm/rd.cpuPlain)
			}
			totW, totN := rd.cpuWarm+rd.warm.clientCPU, rd.cpuNginx+rd.nginx.clientCPU
			tw, tn = append(tw, totW), append(tn, totN)
			if totN > 0 {
				tr = append(tr, totW/totN)
			}
		}
		w("| %s | %.1f / %.1f / %.1f | **%.2f×** (%s) | %.1f / %.1f / %.1f / %.1f | **%.2f×** (target ≤ 1.15×: %s; %s) | %.2f× | %.1f / %.1f | %.2f× (%s) |\n",
			backendName(res.backend), median(rw), median(rn), median(rp), median(rr), fmtList(rr, 2),
			median(cw), median(cc), median(cn), median(cp), median(cr), verdict(median(cr) <= 1.15), fmtList(cr, 2), median(cf),
			median(tw), median(tn), median(tr), fmtList(tr, 2))
	}
	w("\nServer + clients: the server's CPU per answer plus the clients' (the bench process's CPU over the crowd, per answer). On loopback the kernel's TCP work for a transfer is charged partly to the sending process and partly to the receiving one, in shares that depend on their pacing, so the server's CPU alone can differ where the machine's work does not.\n\n")
}
