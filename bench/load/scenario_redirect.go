package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// tokenSeq makes every token of the run distinct: a token's only varying
// claim is exp, so each one gets its own second.
var tokenSeq atomic.Int64

// redirectScenario is (b): the edge's 302 to a presigned S3 URL (record
// cached) as production runs it — audience hmac_sha256, INFO log, every
// request with its own token — against a stock Caddy `redir` of a URL of
// the same length, driven by the same kind of targets (distinct query
// strings, so both sides parse similar URLs). Beside it, the same edge
// with `audience template`. Loaded with vegeta, redirects not followed.
func redirectScenario(e *env, rep *report) error {
	edgeAdmin, plainAdmin := freePort(), freePort()
	pHMAC, pTmpl, pPlain := freePort(), freePort(), freePort()
	edgeCfg := fmt.Sprintf(globalOpts, edgeAdmin) +
		edgeSite(pHMAC, audHMAC, e.s3Block(), "delivery redirect") +
		edgeSite(pTmpl, audTemplate, e.s3Block(), "delivery redirect")
	edge, err := e.startCaddy("redirect-edge", *flagCaddy, edgeCfg)
	if err != nil {
		return err
	}
	exp := time.Now().Add(time.Hour)
	hmacURL := func(port int) string { return segURL(port, e.redir.id, e.hmacToken(e.redir.id, exp)) }
	tmplURL := func(port int) string { return segURL(port, e.redir.id, e.token(e.redir.id, exp)) }
	if err := waitHTTP(edge, hmacURL(pHMAC)); err != nil {
		return err
	}
	// Both sites redirect their own tokens and refuse the other audience,
	// so each measures the rule it names.
	loc, err := expectStatus(hmacURL(pHMAC), http.StatusFound)
	if err != nil {
		return fmt.Errorf("hmac_sha256 site: %w", err)
	}
	if _, err := expectStatus(tmplURL(pTmpl), http.StatusFound); err != nil {
		return fmt.Errorf("template site: %w", err)
	}
	if _, err := expectStatus(tmplURL(pHMAC), http.StatusForbidden); err != nil {
		return fmt.Errorf("hmac_sha256 site, template-audience token: %w", err)
	}
	if _, err := expectStatus(hmacURL(pTmpl), http.StatusForbidden); err != nil {
		return fmt.Errorf("template site, hmac-audience token: %w", err)
	}

	// The plain side redirects to the edge's Location itself: the same
	// response on both sides.
	plain, err := e.startCaddy("redirect-plain", *flagPlain, fmt.Sprintf(globalOpts, plainAdmin)+fmt.Sprintf(`
http://127.0.0.1:%d {
	redir "%s" 302
}
`, pPlain, loc))
	if err != nil {
		return err
	}
	if err := waitHTTP(plain, hmacURL(pPlain)); err != nil {
		return err
	}
	if _, err := expectStatus(hmacURL(pPlain), http.StatusFound); err != nil {
		return fmt.Errorf("plain redir: %w", err)
	}

	// targets is a side that writes a fresh file of *flagTargets distinct
	// signed URLs on port (tokens from tok) before each run.
	targets := func(name string, p *proc, admin, port int, tok func(id string, exp time.Time) string) side {
		path := filepath.Join(e.dir, name+".targets")
		return side{proc: p, admin: admin, load: vegetaLoad(path), prepare: func() error {
			base := time.Now().Add(time.Hour)
			first := tokenSeq.Add(int64(*flagTargets)) - int64(*flagTargets)
			return writeTargets(path, *flagTargets, func(i int) string {
				return segURL(port, e.redir.id, tok(e.redir.id, base.Add(time.Duration(first+int64(i))*time.Second)))
			})
		}}
	}
	tool := "`" + *flagVegeta + " " + strings.Join(vegetaAttackArgs("<file>", *flagDur), " ") +
		"` then `vegeta report -type json`; the file holds " + fmt.Sprintf("%d", *flagTargets) +
		" `GET <url>` targets, each with its own token, written afresh before every run"
	pairs := []*pair{{
		id:     "b",
		name:   "(b) redirect, production config (`audience hmac_sha256`, INFO log, a distinct token per request): edge (S3, record cached) / redir",
		want:   http.StatusFound,
		target: 0.95, // the target: both measures ≥ 0.95× a bare redir
		tool:   tool,
		edge:   targets("b-edge-hmac", edge, edgeAdmin, pHMAC, e.hmacToken),
		plain:  targets("b-plain-hmac", plain, plainAdmin, pPlain, e.hmacToken),
	}, {
		id:    "b-template",
		name:  "(b) redirect, `audience template`, a distinct token per request: edge (S3, record cached) / redir",
		want:  http.StatusFound,
		tool:  tool,
		edge:  targets("b-edge-template", edge, edgeAdmin, pTmpl, e.token),
		plain: targets("b-plain-template", plain, plainAdmin, pPlain, e.token),
	}}
	if *flagBase != "" {
		baseAdmin := freePort()
		bHMAC, bTmpl := freePort(), freePort()
		base, err := e.startCaddy("redirect-edge-base", *flagBase, fmt.Sprintf(globalOpts, baseAdmin)+
			edgeSite(bHMAC, audHMAC, e.s3Block(), "delivery redirect")+
			edgeSite(bTmpl, audTemplate, e.s3Block(), "delivery redirect"))
		if err != nil {
			return err
		}
		if err := waitHTTP(base, hmacURL(bHMAC)); err != nil {
			return err
		}
		if _, err := expectStatus(hmacURL(bHMAC), http.StatusFound); err != nil {
			return fmt.Errorf("base build: %w", err)
		}
		pairs[0].peers = append(pairs[0].peers, basePeer(targets("b-base-hmac", base, baseAdmin, bHMAC, e.hmacToken)))
		pairs[1].peers = append(pairs[1].peers, basePeer(targets("b-base-template", base, baseAdmin, bTmpl, e.token)))
	}
	rep.pairs = append(rep.pairs, pairs...)
	return abba(pairs, *flagRounds)
}

// expectStatus GETs u without following redirects and checks the status;
// it returns the Location.
func expectStatus(u string, want int) (string, error) {
	resp, err := (&http.Client{CheckRedirect: noRedirect, Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		return "", fmt.Errorf("answered %d, want %d", resp.StatusCode, want)
	}
	if want == http.StatusFound && resp.Header.Get("Location") == "" {
		return "", fmt.Errorf("302 without Location")
	}
	return resp.Header.Get("Location"), nil
}
