package main

import (
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"time"
)

const (
	ttfbFollowers = 20
	ttfbLag       = 20 * time.Millisecond // followers start this long after the leader
)

type ttfbRound struct {
	leader, followersMed, followersMax time.Duration
	reads, followers                   int
}

// ttfbScenario is (g): one leader request on a cold 64 MiB segment starts
// the fill; ttfbFollowers requests follow ttfbLag later; each measures its
// time to first body byte and downloads (and checks) the whole body.
func ttfbScenario(e *env, rep *report) error {
	l, err := e.large()
	if err != nil {
		return err
	}
	results := map[string][]*ttfbRound{}
	for _, b := range largeBackends {
		for r := range *flagLargeRounds {
			name := fmt.Sprintf("ttfb-%s-%d", b, r)
			edge, err := e.startLargeEdge(name, b, filepath.Join(e.dir, name+"-disk"))
			if err != nil {
				return err
			}
			reads0 := edge.storeReads()
			f0, _ := metricSum(edge.admin, "caddy_syncular_disk_followers_total")
			c, err := runCrowd(1+ttfbFollowers, edge.url, l.bytes, 0, 0, func(i int) time.Duration {
				if i == 0 {
					return 0
				}
				return ttfbLag
			})
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if c.ok != c.clients {
				return fmt.Errorf("%s: %d of %d downloads failed: %v", name, c.clients-c.ok, c.clients, c.firstErr)
			}
			f1, _ := metricSum(edge.admin, "caddy_syncular_disk_followers_total")
			fol := slices.Clone(c.ttfb[1:])
			slices.Sort(fol)
			rd := &ttfbRound{leader: c.ttfb[0], followersMed: fol[len(fol)/2], followersMax: fol[len(fol)-1],
				reads: edge.storeReads() - reads0, followers: int(f1 - f0)}
			edge.stop()
			log.Printf("(g) %s round %d: leader TTFB %v, followers median %v max %v, %d store reads, %d disk followers",
				b, r+1, rd.leader, rd.followersMed, rd.followersMax, rd.reads, rd.followers)
			results[b] = append(results[b], rd)
		}
	}
	rep.addSection(func(w func(string, ...any)) {
		w("## (g) Time to first byte during a fill: leader and followers\n\n")
		w("Per round a fresh edge (empty disk directory): one leader GET of the cold 64 MiB segment, then %d followers %s after it, each timing its first body byte from its own request start, then reading and checking the whole body. Followers: `caddy_syncular_disk_followers_total` (reads that joined the running fill).\n\n", ttfbFollowers, ttfbLag)
		w("| backend | round | leader TTFB | followers TTFB median | followers TTFB max | store reads of the bytes | disk followers |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, b := range largeBackends {
			for i, rd := range results[b] {
				w("| %s | %d | %s | %s | %s | %d | %d |\n", backendName(b), i+1, durMs(rd.leader), durMs(rd.followersMed), durMs(rd.followersMax), rd.reads, rd.followers)
			}
		}
		w("\n")
	})
	return nil
}
