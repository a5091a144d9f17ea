package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// serveScenario is (a): the edge serving the 256 KiB SQLite segment (warm
// cache) against file_server serving the same bytes from disk under the
// same path and query (Caddy's floor), nginx serving them with sendfile
// behind an MD5 secure link, and Go's floor (floor.go) writing them from
// memory, one URL each, loaded with hey.
func serveScenario(e *env, rep *report) error {
	edgeAdmin, plainAdmin := freePort(), freePort()
	pEdge, pPlain := freePort(), freePort()
	edge, err := e.startCaddy("serve-edge", *flagCaddy,
		fmt.Sprintf(globalOpts, edgeAdmin)+edgeSite(pEdge, audTemplate, "store sqlite "+e.dbPath, ""))
	if err != nil {
		return err
	}
	plain, err := e.startCaddy("serve-plain", *flagPlain, fmt.Sprintf(globalOpts, plainAdmin)+fmt.Sprintf(`
http://127.0.0.1:%d {
	root * %s
	file_server
}
`, pPlain, e.www))
	if err != nil {
		return err
	}
	tok := e.token(e.serveID, time.Now().Add(time.Hour))
	edgeURL, plainURL := segURL(pEdge, e.serveID, tok), segURL(pPlain, e.serveID, tok)
	if err := waitHTTP(edge, edgeURL); err != nil {
		return err
	}
	if err := waitHTTP(plain, plainURL); err != nil {
		return err
	}
	if err := sameBody(edgeURL, plainURL); err != nil {
		return err
	}
	ngx, err := e.startNginx("serve-nginx", e.www)
	if err != nil {
		return err
	}
	if err := checkNginx(ngx, e.serveID, edgeURL); err != nil {
		return err
	}
	ngxURL := ngx.url(e.serveID, time.Now().Add(time.Hour))
	floor, floorPort, err := e.startFloor("serve-floor", filepath.Join(e.www, "sync", "segments", e.serveID))
	if err != nil {
		return err
	}
	floorURL := segURL(floorPort, e.serveID, tok)
	if err := waitHTTP(floor, floorURL); err != nil {
		return err
	}
	if err := sameBody(edgeURL, floorURL); err != nil {
		return err
	}
	p := &pair{
		id:     "a",
		name:   "(a) serve 256 KiB: edge (SQLite, warm cache) / file_server",
		want:   http.StatusOK,
		target: 2.0, // the target: the serve hit stays ≥ 2.0× file_server
		tool:   "`" + strings.Join(append([]string{*flagHey}, heyArgs(*flagDur, "<url>")...), " ") + "` (one URL, one token)",
		edge:   side{proc: edge, admin: edgeAdmin, load: heyLoad(edgeURL)},
		plain:  side{proc: plain, load: heyLoad(plainURL)},
		peers: []*peer{
			// the memory-tier hit at least as fast as nginx sending the file
			{name: "nginx", note: nginxNote(), side: side{proc: ngx.proc, load: heyLoad(ngxURL), cpu: ngx.cpu}, target: 1.0},
			{name: "Go's floor", note: "the bench binary as a minimal Go `net/http` server (bench/load/floor.go): the file read into memory once, each request answered with `Content-Length` and the bytes in one `Write`, no token checked. Caddy's own floor is the plain side: stock `file_server` of the same file (`static_response` cannot carry binary bytes)", side: side{proc: floor, load: heyLoad(floorURL)}},
		},
	}
	if *flagBase != "" {
		baseAdmin, pBase := freePort(), freePort()
		base, err := e.startCaddy("serve-edge-base", *flagBase,
			fmt.Sprintf(globalOpts, baseAdmin)+edgeSite(pBase, audTemplate, "store sqlite "+e.dbPath, ""))
		if err != nil {
			return err
		}
		baseURL := segURL(pBase, e.serveID, tok)
		if err := waitHTTP(base, baseURL); err != nil {
			return err
		}
		if err := sameBody(edgeURL, baseURL); err != nil {
			return err
		}
		p.peers = append(p.peers, basePeer(side{proc: base, admin: baseAdmin, load: heyLoad(baseURL)}))
	}
	rep.pairs = append(rep.pairs, p)
	return abba([]*pair{p}, *flagRounds)
}

// basePeer is the -caddy-base build as a peer of the edge.
func basePeer(s side) *peer {
	return &peer{name: "base build", note: "`-caddy-base " + *flagBase + "`: another build of the edge with the same config, in the same rounds (edge ÷ base compares the two builds)", side: s}
}

// sameBody checks that a and b answer 200 with the same bytes.
func sameBody(a, b string) error {
	var sums [2][32]byte
	for i, u := range []string{a, b} {
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("GET %s: %d %v", u, resp.StatusCode, err)
		}
		sums[i] = sha256.Sum256(body)
	}
	if sums[0] != sums[1] {
		return errors.New("edge and file_server bodies differ")
	}
	return nil
}
