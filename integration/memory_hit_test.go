package integration

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Memory tier hits as one chunk of Caddy's idle timeout writer, in raw
// write(2) calls (caddymodule/membody.go), through the real binary: an
// answer makes a few write calls where the writer's own chunks make one
// per 64 KiB (SYNCULAR_RAW_WRITE=off, the control), and the server's
// write_idle keeps its meaning: a reader that keeps taking bytes slowly
// gets the whole answer, one that stops taking bytes is cut.

// memSite is an edge whose segments are answered from the memory tier
// (no disk tier), under a write_idle timeout of one second.
const memSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
	servers {
		timeouts {
			write_idle 1s
		}
	}
	log {
		output file {{DIR}}/server.log
	}
}

http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store sqlite DB
		untokened reject
		cache_status on
		cache {
			disk off
		}
	}
	respond 404
}
`

// startMemEdge seeds seg into a SQLite store and starts an edge on it;
// it returns the edge and the segment's signed URL, already a memory
// tier hit.
func startMemEdge(t *testing.T, seg []byte, env ...string) (largeEdge, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sync.db")
	id := seedStore(t, path, "wal", seg)[0]
	key := newKey32(t)
	env = append(env, "SEG_KEY=hex:"+hex.EncodeToString(key))
	e := largeEdge{c: startCaddy(t, strings.Replace(memSite, "DB", path, 1), env...), key: key}
	url := e.url(id)
	for i := range 2 { // the first answer fills the memory tier
		r, err := rawGet("GET", url, nil)
		if err != nil || r.Status != 200 || !bytes.Equal(r.Body, seg) {
			t.Fatalf("answer %d: %d, %d bytes, %v", i, r.Status, len(r.Body), err)
		}
		if i == 1 && !strings.Contains(r.Header.Get("Cache-Status"), "detail=memory") {
			t.Fatalf("second answer: Cache-Status %q, want a memory hit", r.Header.Get("Cache-Status"))
		}
	}
	return e, url
}

// A memory hit of 1 MiB makes a few write calls, where the idle timeout
// writer's 64 KiB chunks (the switch off) make one or more per chunk.
func TestMemoryHitWrites(t *testing.T) {
	straceBinary(t)
	const size, perCase = 1 << 20, 5
	seg := pseudoRandom(size, 33)
	count := func(t *testing.T, env ...string) int {
		e, url := startMemEdge(t, seg, env...)
		counts := straceDuring(t, e.c.pid(), func() {
			for range perCase {
				r, err := rawGet("GET", url, nil)
				if err != nil || r.Status != 200 || !bytes.Equal(r.Body, seg) {
					t.Fatalf("%d, %d bytes, %v", r.Status, len(r.Body), err)
				}
			}
		})
		t.Logf("%v: %d answers of %d bytes: %v", env, perCase, size, counts)
		return counts["write"] + counts["writev"] + counts["sendto"] + counts["sendfile"]
	}
	raw := count(t)
	off := count(t, "SYNCULAR_RAW_WRITE=off")
	// The control: the count sees the writer's chunks.
	if off < perCase*size/(64<<10) {
		t.Fatalf("switch off: only %d write calls for %d answers: the count misses the chunks", off, perCase)
	}
	// One chunk: the header with net/http's first 512 bytes, then as
	// many raw writes as the socket buffer needs (on loopback one or
	// two, and the odd EAGAIN).
	if limit := perCase * 6; raw > limit {
		t.Fatalf("%d write calls for %d answers (limit %d; the writer's chunks make %d): the memory hit no longer goes as one chunk", raw, perCase, limit, off)
	}
}

// memMiB is a memory tier segment larger than loopback's largest socket
// send buffer (tcp_wmem's 4 MiB by default), so that a reader that
// lags makes the raw writes wait for room.
const memMiB = 6

// readSlowly reads the answer to GET url on a connection with a small
// receive buffer, per bytes every pause (forever when pause is 0 after
// the header: the reader stops), until the connection ends or within.
func readSlowly(t *testing.T, url string, per int, pause, within time.Duration) (body []byte, err error) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	conn, derr := net.Dial("tcp", req.URL.Host)
	if derr != nil {
		t.Fatal(derr)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(16 << 10)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(within))
	res, rerr := http.ReadResponse(bufio.NewReaderSize(conn, 4<<10), req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if pause == 0 {
		time.Sleep(5 * time.Second) // five idle timeouts, reading nothing
		return io.ReadAll(res.Body)
	}
	buf := make([]byte, per)
	for {
		n, err := io.ReadFull(res.Body, buf)
		body = append(body, buf[:n]...)
		switch {
		case int64(len(body)) == res.ContentLength:
			return body, nil
		case err != nil:
			return body, err
		}
		time.Sleep(pause)
	}
}

// A reader that keeps taking bytes, slowly (128 KiB every 100 ms, the
// whole answer over several write_idle timeouts), gets all of it.
func TestMemoryHitSlowReaderKept(t *testing.T) {
	seg := pseudoRandom(memMiB<<20, 34)
	_, url := startMemEdge(t, seg)
	t0 := time.Now()
	body, err := readSlowly(t, url, 128<<10, 100*time.Millisecond, 2*time.Minute)
	took := time.Since(t0)
	if err != nil || !bytes.Equal(body, seg) {
		t.Fatalf("slow reader: %d of %d bytes after %v: %v (cut by write_idle 1s?)", len(body), len(seg), took, err)
	}
	if took < 3*time.Second {
		t.Fatalf("the answer took %v, under 3 idle timeouts: it proves nothing", took)
	}
}

// A reader that stops taking bytes is cut: after five idle timeouts of
// reading nothing, what it can still read ends short of the answer.
func TestMemoryHitStalledReaderCut(t *testing.T) {
	seg := pseudoRandom(memMiB<<20, 35)
	_, url := startMemEdge(t, seg)
	body, err := readSlowly(t, url, 0, 0, 2*time.Minute)
	if err == nil || len(body) >= len(seg) {
		t.Fatalf("stalled reader: read %d of %d bytes after stalling (%v), want the connection cut", len(body), len(seg), err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("stalled reader: the connection did not end within 2 minutes: %v", err)
	}
	t.Logf("stalled reader: %d of %d bytes, then %v", len(body), len(seg), fmt.Sprint(err))
}
