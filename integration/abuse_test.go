package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/token"
)

const abuseSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	syncular_segments /segments/* {
		key {env.SEG_KEY}
		audience template aud:{partition}
		store s3 {
			bucket segs
			region us-east-1
			endpoint ENDPOINT
			access_key_id {env.S3_KEY}
			secret_access_key {env.S3_SECRET}
		}
		delivery proxy
		store_timeout 2s
		untokened reject
	}
	respond "not the segment handler" 418
}
`

// TestAbuse: forged and oversize tokens never reach the bucket, huge URLs
// and headers are refused by Caddy before the handler, many ranges cost
// one plain answer, slow readers cannot pin memory in proxy mode, and
// clients that leave mid-download give back their fds and goroutines.
func TestAbuse(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, "segs")
	small := pseudoRandom(32<<10, 11)
	huge := pseudoRandom(48<<20, 12) // larger than the bytes cache's max entry: streams
	id := s3Segment(t, srv, small)
	// Never fetched before the flood, so no cache entry can hide a store read.
	fresh := pseudoRandom(16<<10, 13)
	freshID := s3Segment(t, srv, fresh)
	hugeID := s3Segment(t, srv, huge)
	key := randKey(t)
	c := startCaddy(t, strings.Replace(abuseSite, "ENDPOINT", srv.Endpoint, 1),
		"SEG_KEY="+key, "S3_KEY="+srv.AccessKey, "S3_SECRET="+srv.SecretKey)
	good := signURL(c.Base, key, id, 15*time.Minute)
	checkSegment(t, do(t, "GET", good, nil), id)

	t.Run("forged flood never reaches the store", func(t *testing.T) {
		before := srv.CountRequests(t, "", "")
		exp := time.Now().Add(time.Minute).Unix()
		valid := token.Sign([]byte(key), freshID, hardDigest, hardAud, exp)
		forgeries := []string{
			token.Sign([]byte("not-the-key"), freshID, hardDigest, hardAud, exp),
			valid[:len(valid)-4] + "AAAA",
			token.Sign([]byte(key), freshID, hardDigest, hardAud, time.Now().Add(-time.Hour).Unix()),
			token.Sign([]byte(key), "sha256:"+strings.Repeat("1", 64), hardDigest, hardAud, exp),
			strings.Repeat("A", 5000) + "." + strings.Repeat("B", 43),
			strings.Repeat("x", 12000),
			"",
			"..",
		}
		start := time.Now()
		tally := hammer(2000, 8, 60*time.Second, func(i int) string {
			return c.Base + "/segments/" + freshID + "?st=" + forgeries[i%len(forgeries)]
		})
		took := time.Since(start)
		if tally[403] != 2000 {
			t.Errorf("forged flood answers %v, want 2000 × 403", tally)
		}
		after := srv.CountRequests(t, "", "")
		t.Logf("2,000 forged tokens: %v in %s; bucket requests %d before, %d after", tally, took.Round(time.Millisecond), before, after)
		if after != before {
			t.Errorf("forged tokens reached the bucket: %d requests", after-before)
		}
		checkSegment(t, do(t, "GET", signURL(c.Base, key, freshID, time.Minute), nil), freshID)
		if n := srv.CountRequests(t, "", ""); n == after {
			t.Errorf("a granted request did not show in the access log: the counter is blind")
		}
	})

	t.Run("oversize token and URL", func(t *testing.T) {
		// Above max_token_length (4096): 403 before any crypto.
		over := do(t, "GET", c.Base+"/segments/"+id+"?st="+strings.Repeat("A", 4097), nil)
		checkError(t, over, 403, "sync.forbidden")
		// 12 KB token: within Caddy's header limit, still a cheap 403.
		big := do(t, "GET", c.Base+"/segments/"+id+"?st="+strings.Repeat("A", 12<<10), nil)
		checkError(t, big, 403, "sync.forbidden")
		// Beyond Caddy's header limit (16 KiB by default, servers >
		// max_header_size): the server refuses it with 431 before routing.
		for name, req := range map[string]string{
			"64 KiB URL":   "GET /segments/" + id + "?st=" + strings.Repeat("A", 64<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"2 MiB URL":    "GET /segments/" + id + "?st=" + strings.Repeat("A", 2<<20) + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"2 MiB header": "GET /segments/" + id + "?st=x HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("A", 2<<20) + "\r\n\r\n",
		} {
			status, err := rawStatus(c.Port, req)
			t.Logf("%s: %d %v", name, status, err)
			if status != 431 && err == nil {
				t.Errorf("%s: status %d, want 431", name, status)
			}
		}
		checkSegment(t, do(t, "GET", good, nil), id)
	})

	t.Run("many ranges", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("bytes=")
		for i := 0; i < 1000; i++ { // ~7 KB: within the header limit
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%d-%d", i, i)
		}
		r := do(t, "GET", good, map[string]string{"Range": b.String()})
		checkSegment(t, r, id)
		if r.Header.Get("Content-Range") != "" || strings.Contains(r.Header.Get("Content-Type"), "multipart") {
			t.Errorf("many ranges: headers %v", r.Header)
		}
		r = do(t, "GET", good, map[string]string{"Range": "bytes=10-19"})
		if r.Status != 206 || string(r.Body) != string(small[10:20]) {
			t.Errorf("single range: %d %q", r.Status, r.Header.Get("Content-Range"))
		}
	})

	t.Run("slow readers and disconnects", func(t *testing.T) {
		hugeURL := signURL(c.Base, key, hugeID, 15*time.Minute)
		path := strings.TrimPrefix(hugeURL, c.Base)
		// Warm: one full download, so lazily built state exists.
		r := do(t, "GET", hugeURL, nil)
		if r.Status != 200 || len(r.Body) != len(huge) {
			t.Fatalf("huge segment: %d, %d bytes", r.Status, len(r.Body))
		}
		base := c.resources(t)
		rssBase := c.rssKB(t)
		const readers = 10
		var conns []net.Conn
		for i := 0; i < readers; i++ {
			d := net.Dialer{Control: nil}
			conn, err := d.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port))
			if err != nil {
				t.Fatal(err)
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetReadBuffer(16 << 10) // a slow client's small window
			}
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path)
			conns = append(conns, conn)
		}
		defer func() {
			for _, conn := range conns {
				conn.Close()
			}
		}()
		// Each reads its headers and a trickle: 64 KiB over ~2 s.
		var wg sync.WaitGroup
		for _, conn := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReaderSize(conn, 4096)
				status, _ := br.ReadString('\n')
				if !strings.Contains(status, " 200 ") {
					t.Errorf("slow reader got %q", status)
					return
				}
				buf := make([]byte, 4096)
				for i := 0; i < 16; i++ {
					if _, err := io.ReadFull(br, buf); err != nil {
						t.Errorf("slow read: %v", err)
						return
					}
					time.Sleep(120 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond)
		rssSlow := c.rssKB(t)
		during := c.resources(t)
		growth := rssSlow - rssBase
		t.Logf("proxy mode, %d slow readers of a %d MiB segment: RSS %d KiB → %d KiB (+%d KiB; %d MiB if buffered whole); %s → %s",
			readers, len(huge)>>20, rssBase, rssSlow, growth, readers*len(huge)>>20, base, during)
		if growth > 64<<10 {
			t.Errorf("slow readers grew RSS by %d KiB: bodies are being buffered", growth)
		}
		// Disconnect mid-download: everything comes back.
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
		after := c.settleTo(t, base, 3, 3)
		t.Logf("after %d clients left mid-download: %s (baseline %s)", readers, after, base)
		if after.FDs > base.FDs+3 || after.Goroutines > base.Goroutines+3 {
			t.Errorf("resources not freed after disconnects: baseline %s, after %s", base, after)
		}

		// 50 more clients that each read 1 MiB and hang up.
		for i := 0; i < 50; i++ {
			res, err := http.Get(hugeURL)
			if err != nil {
				t.Fatal(err)
			}
			io.CopyN(io.Discard, res.Body, 1<<20)
			res.Body.Close() // closes the connection: the body is unread
		}
		http.DefaultClient.CloseIdleConnections()
		after = c.settleTo(t, base, 3, 3)
		t.Logf("after 50 more early hang-ups: %s (baseline %s)", after, base)
		if after.FDs > base.FDs+3 || after.Goroutines > base.Goroutines+3 {
			t.Errorf("resources not freed after hang-ups: baseline %s, after %s", base, after)
		}
		checkSegment(t, do(t, "GET", good, nil), id)
	})
}

// rawStatus writes req on a fresh connection and returns the status code
// of the answer (0 and an error when the server closed instead).
func rawStatus(port int, req string) (int, error) {
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	go io.WriteString(conn, req) // the server may answer before reading it all
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, err
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, fmt.Errorf("status line %q", line)
	}
	return strconv.Atoi(f[1])
}

// TestSlowReadersSQLite measures what slow readers pin in serve mode from
// SQLite: a segment larger than the bytes cache's max entry is read into
// memory whole for each request (the SQLite store reads the blob in one
// statement), so memory grows with (slow readers × segment size) until
// they finish or a server write timeout cuts them. The test records the
// figure and checks it stays within that bound and is released.
func TestSlowReadersSQLite(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/sync.db"
	seg := pseudoRandom(16<<20, 21)
	ids := seedStore(t, path, "wal", seg)
	key := randKey(t)
	c := startCaddy(t, strings.Replace(faultSQLiteSite, "STORE_PATH", path, 1), "SEG_KEY="+key)
	u := signURL(c.Base, key, ids[0], 15*time.Minute)
	checkSegment(t, do(t, "GET", u, nil), ids[0])
	rssBase := c.rssKB(t)
	base := c.resources(t)
	const readers = 6
	var conns []net.Conn
	for i := 0; i < readers; i++ {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port))
		if err != nil {
			t.Fatal(err)
		}
		conn.(*net.TCPConn).SetReadBuffer(16 << 10)
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", strings.TrimPrefix(u, c.Base))
		conns = append(conns, conn)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	rss := c.rssKB(t)
	t.Logf("serve mode (SQLite), %d stalled readers of a %d MiB segment: RSS %d KiB → %d KiB (+%d MiB)",
		readers, len(seg)>>20, rssBase, rss, (rss-rssBase)>>10)
	// Per reader the blob exists twice until the next GC (the driver's
	// copy and database/sql's), so the bound is two segments per reader
	// plus two of slack; one per reader was exceeded by 0.5 MiB in a run.
	if rss-rssBase > (2*readers+2)*(len(seg)>>10) {
		t.Errorf("RSS grew by %d KiB, more than two segments per reader", rss-rssBase)
	}
	for _, conn := range conns {
		conn.Close()
	}
	after := c.settleTo(t, base, 3, 3)
	t.Logf("after the readers left: %s (baseline %s)", after, base)
	if after.FDs > base.FDs+3 || after.Goroutines > base.Goroutines+3 {
		t.Errorf("resources not freed: baseline %s, after %s", base, after)
	}
}
