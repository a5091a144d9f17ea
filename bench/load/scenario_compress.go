package main

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/segdata"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// compressRows is the row count of the (i) wire measurement's segments:
// a real SQLite image and a rows segment of the same rows.
const compressRows = 50_000

// wireRow is one segment's bytes on the wire per coding.
type wireRow struct {
	name     string
	identity int64
	wire     map[compress.Coding]int64         // body bytes of one download
	encWall  map[compress.Coding]time.Duration // compress.Variant in this process
	encCPU   map[compress.Coding]time.Duration
	edgeWait map[compress.Coding]time.Duration // first request to first coded answer, on the edge
}

var wireCodings = []compress.Coding{compress.Gzip, compress.Zstd}

// compressScenario is (i): compressed delivery. (1) Bytes on the wire of
// one download of a 50,000-row SQLite image and rows segment
// (internal/segdata), identity vs gzip vs zstd, each answer decoded and
// checked against the segment; the encode time of each variant (encode +
// verify, compress.Variant, in this process) and how long the edge took
// from the first request to the first coded answer. (2) Throughput of a
// compressed cache hit against an identity cache hit of the same
// segment on the same edge (256 KiB and 8 MiB rows segments), hey with
// and without Accept-Encoding, in ABBA rounds.
func compressScenario(e *env, rep *report) error {
	dir := filepath.Join(e.dir, "compress")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	log.Printf("building a %d-row SQLite image and rows segment", compressRows)
	img, err := segdata.SQLiteImage(dir, compressRows)
	if err != nil {
		return err
	}
	rows := segdata.RowsSegment(compressRows)
	small, large := rows[:256<<10], rows[:8<<20]
	segs := []struct {
		name string
		b    []byte
	}{
		{fmt.Sprintf("SQLite image, %d rows", compressRows), img},
		{fmt.Sprintf("rows segment, %d rows", compressRows), rows},
		{"rows segment, 256 KiB", small},
		{"rows segment, 8 MiB", large},
	}
	dbPath := filepath.Join(dir, "compress.db")
	w, err := seed.Create(dbPath, 3)
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	ids := make([]string, len(segs))
	for i, s := range segs {
		if ids[i], err = w.Put(seed.SegmentInput{Bytes: s.b, Publication: store.Publication{
			Partition: partition, LogEpoch: "e1", Table: "tasks", ScopeDigest: scopeDigest,
			AsOfCommitSeq: 1, RowCount: 1, CreatedAtMs: now, ExpiresAtMs: now + 24*3600*1000,
		}}); err != nil {
			w.Close()
			return err
		}
	}
	if err := w.SetEpoch(partition, "e1", now); err != nil {
		w.Close()
		return err
	}
	w.Close()

	admin, port := freePort(), freePort()
	// A cache large enough to hold the 50,000-row segments and their
	// variants (the default max_entry, 8 MiB, would stream them
	// identity).
	cacheBlock := "cache {\n\t\t\tmax_bytes 512MiB\n\t\t\tmax_entry 64MiB\n\t\t}"
	edge, err := e.startCaddy("compress-edge", *flagCaddy,
		fmt.Sprintf(globalOpts, admin)+edgeSite(port, audTemplate, "store sqlite "+dbPath, cacheBlock))
	if err != nil {
		return err
	}
	urls := make([]string, len(segs))
	for i := range segs {
		urls[i] = segURL(port, ids[i], e.token(ids[i], time.Now().Add(24*time.Hour)))
	}
	// Not a segment URL: Go's client sends Accept-Encoding: gzip, which
	// would start a gzip build before it is timed.
	if err := waitHTTP(edge, fmt.Sprintf("http://127.0.0.1:%d/", port)); err != nil {
		return err
	}

	var wire []*wireRow
	for i, s := range segs[:2] {
		r, err := measureWire(s.name, s.b, urls[i])
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		wire = append(wire, r)
	}

	var pairs []*pair
	for i, s := range segs[2:] {
		u := urls[2+i]
		// Warm both: identity read into memory, the zstd variant built.
		if _, err := coded(u, ""); err != nil {
			return err
		}
		if _, err := awaitCoded(u, "zstd", s.b); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		zstdHdr := []string{"-H", "Accept-Encoding: zstd"}
		pairs = append(pairs, &pair{
			id:     fmt.Sprintf("i-%d", len(s.b)>>10),
			name:   fmt.Sprintf("(i) cache hit, %s: zstd variant (edge column) / identity (plain column), same edge", s.name),
			want:   http.StatusOK,
			target: 0.9,
			tool:   "`" + strings.Join(append([]string{*flagHey}, heyArgs(*flagDur, "<url>", "-H", "'Accept-Encoding: zstd'")...), " ") + "` against the same command without `-H`",
			edge:   side{proc: edge, admin: admin, load: heyLoad(u, zstdHdr...)},
			plain:  side{proc: edge, load: heyLoad(u)},
		})
	}
	rep.pairs = append(rep.pairs, pairs...)
	if err := abba(pairs, *flagRounds); err != nil {
		return err
	}
	rep.addSection(func(w func(string, ...any)) { compressMarkdown(w, wire) })
	return nil
}

// measureWire downloads b from u as identity, gzip and zstd (waiting for
// each variant to be built), checking every answer decodes to b, and
// times compress.Variant on b in this process.
func measureWire(name string, b []byte, u string) (*wireRow, error) {
	r := &wireRow{name: name, identity: int64(len(b)), wire: map[compress.Coding]int64{},
		encWall: map[compress.Coding]time.Duration{}, encCPU: map[compress.Coding]time.Duration{},
		edgeWait: map[compress.Coding]time.Duration{}}
	id := segmentID(b)
	for _, c := range wireCodings {
		cpu0, wall0 := cpuSelf(), time.Now()
		v, err := compress.Variant(c, b, segid.MustParseID(id))
		r.encWall[c], r.encCPU[c] = time.Since(wall0), cpuSelf()-cpu0
		if err != nil {
			return nil, fmt.Errorf("compress.Variant %v: %w", c, err)
		}
		log.Printf("%s: %v %d -> %d bytes, encode+verify %s wall, %s CPU", name, c, len(b), len(v), r.encWall[c].Round(time.Millisecond), r.encCPU[c].Round(time.Millisecond))
	}
	body, err := coded(u, "")
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(body.decoded, b) || body.encoding != "" {
		return nil, fmt.Errorf("identity download: %q, %d bytes", body.encoding, len(body.decoded))
	}
	r.wire[compress.Identity] = body.wire
	for _, c := range wireCodings {
		t0 := time.Now()
		got, err := awaitCoded(u, c.String(), b)
		if err != nil {
			return nil, err
		}
		r.edgeWait[c] = time.Since(t0)
		r.wire[c] = got.wire
		log.Printf("%s: %v on the wire %d bytes (%.2fx), first coded answer after %s", name, c, got.wire, float64(len(b))/float64(got.wire), r.edgeWait[c].Round(time.Millisecond))
	}
	return r, nil
}

type codedBody struct {
	encoding string
	wire     int64
	decoded  []byte
}

var rawHTTP = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableCompression: true}}

// coded GETs u with Accept-Encoding ae ("" sends none) and decodes the
// answer per its Content-Encoding.
func coded(u, ae string) (codedBody, error) {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return codedBody{}, err
	}
	if ae != "" {
		req.Header.Set("Accept-Encoding", ae)
	}
	resp, err := rawHTTP.Do(req)
	if err != nil {
		return codedBody{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return codedBody{}, fmt.Errorf("GET: %d %v", resp.StatusCode, err)
	}
	out := codedBody{encoding: resp.Header.Get("Content-Encoding"), wire: int64(len(raw)), decoded: raw}
	switch out.encoding {
	case "":
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return out, err
		}
		if out.decoded, err = io.ReadAll(zr); err != nil {
			return out, err
		}
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(raw))
		if err != nil {
			return out, err
		}
		defer zr.Close()
		if out.decoded, err = io.ReadAll(zr); err != nil {
			return out, err
		}
	default:
		return out, fmt.Errorf("Content-Encoding %q", out.encoding)
	}
	return out, nil
}

// awaitCoded asks u for coding until the edge answers with it (for up to
// a minute), checking every answer decodes to want.
func awaitCoded(u, coding string, want []byte) (codedBody, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := coded(u, coding)
		if err != nil {
			return got, err
		}
		if !bytes.Equal(got.decoded, want) {
			return got, fmt.Errorf("a %q answer does not decode to the segment", got.encoding)
		}
		if got.encoding == coding {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("no %s answer within a minute", coding)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuSelf is this process's user+system CPU time.
func cpuSelf() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func compressMarkdown(w func(string, ...any), rows []*wireRow) {
	w("## (i) Compressed delivery: bytes on the wire per download\n\n")
	w("One GET per coding from the edge (SQLite store, `cache { max_bytes 512MiB max_entry 64MiB }` so the segments are held in memory; Accept-Encoding none, `gzip`, `zstd`; Go client with compression disabled, so the raw body is counted), each answer decoded and compared with the segment. Encode time: `compress.Variant` (encode + verify, gzip level %d, zstd SpeedBetterCompression, one goroutine) on the same bytes in the benchmark process, wall and CPU. Edge wait: first request for the coding to the first coded answer (the variant is built in the background; answers meanwhile are identity).\n\n", compress.GzipLevel)
	w("| segment | identity bytes | gzip bytes (ratio) | zstd bytes (ratio) | gzip encode+verify wall / CPU | zstd encode+verify wall / CPU | edge wait gzip / zstd |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		ratio := func(c compress.Coding) string {
			return fmt.Sprintf("%d (%.2f×)", r.wire[c], float64(r.identity)/float64(r.wire[c]))
		}
		ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
		w("| %s | %d | %s | %s | %s / %s | %s / %s | %s / %s |\n", r.name, r.wire[compress.Identity], ratio(compress.Gzip), ratio(compress.Zstd),
			ms(r.encWall[compress.Gzip]), ms(r.encCPU[compress.Gzip]), ms(r.encWall[compress.Zstd]), ms(r.encCPU[compress.Zstd]),
			ms(r.edgeWait[compress.Gzip]), ms(r.edgeWait[compress.Zstd]))
	}
	w("\nThe (i) throughput rows above compare, on one edge, hey sending `Accept-Encoding: zstd` (a zstd cache hit, \"edge\" column) with hey sending none (an identity cache hit, \"plain\" column); target ≥ 0.9×.\n\n")
}
