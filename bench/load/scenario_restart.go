package main

import (
	"log"
	"path/filepath"
)

const restartClients = 10

type restartResult struct {
	backend                    string
	readsBefore, readsAfter    int
	okBefore, okAfter, clients int
	hitsAfter, fillsAfter      float64
}

// restartScenario is (h): an edge fills its disk tier with the 64 MiB
// segment and stops; a new edge on the same disk directory serves the
// segment to restartClients clients without reading its bytes from the
// store.
func restartScenario(e *env, rep *report) error {
	l, err := e.large()
	if err != nil {
		return err
	}
	var results []*restartResult
	for _, b := range largeBackends {
		dir := filepath.Join(e.dir, "restart-"+b+"-disk")
		res := &restartResult{backend: b, clients: restartClients}
		first, err := e.startLargeEdge("restart-"+b+"-1", b, dir)
		if err != nil {
			return err
		}
		r0 := first.storeReads()
		c, err := runCrowd(1, first.url, l.bytes, 0, 0, nil)
		if err != nil {
			return err
		}
		res.okBefore, res.readsBefore = c.ok, first.storeReads()-r0
		first.stop()

		second, err := e.startLargeEdge("restart-"+b+"-2", b, dir)
		if err != nil {
			return err
		}
		gets0 := second.storeReads() // S3: the access log is shared, count the difference
		c, err = runCrowd(restartClients, second.url, l.bytes, 0, 0, nil)
		if err != nil {
			return err
		}
		res.okAfter = c.ok
		res.readsAfter = second.storeReads() - gets0
		res.hitsAfter, _ = metricSum(second.admin, "caddy_syncular_disk_hits_total")
		res.fillsAfter, _ = metricSum(second.admin, "caddy_syncular_disk_fills_total")
		second.stop()
		log.Printf("(h) %s: before restart %d ok, %d store reads; after %d/%d ok, %d store reads, disk hits %.0f, fills %.0f (first error: %v)",
			b, res.okBefore, res.readsBefore, res.okAfter, res.clients, res.readsAfter, res.hitsAfter, res.fillsAfter, c.firstErr)
		results = append(results, res)
	}
	rep.addSection(func(w func(string, ...any)) {
		w("## (h) Restart: the disk tier survives\n\n")
		w("An edge downloads the 64 MiB segment once (one fill) and stops; a new edge process on the same `disk` directory serves it to %d clients (every byte checked). Store reads of the bytes: S3, `s3_GetObject` lines of the object key in versitygw's access log; SQLite, the new edge's `caddy_syncular_disk_fills_total`. Disk hits: the new edge's `caddy_syncular_disk_hits_total`.\n\n", restartClients)
		w("| backend | before restart: right bytes, store reads | after: right bytes | after: store reads of the bytes (target 0) | after: disk hits | after: fills |\n|---|---|---:|---:|---:|---:|\n")
		for _, r := range results {
			w("| %s | %d / 1, %d | %d / %d | %d (%s) | %.0f | %.0f |\n", backendName(r.backend), r.okBefore, r.readsBefore,
				r.okAfter, r.clients, r.readsAfter, verdict(r.readsAfter == 0), r.hitsAfter, r.fillsAfter)
		}
		w("\n")
	})
	return nil
}
