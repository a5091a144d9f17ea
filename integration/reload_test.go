package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/token"
)

const reloadCount = 20

// plainCaddyBinary is stock Caddy of the same version (make caddy-plain).
func plainCaddyBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SYNCULAR_CADDY_PLAIN")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), "bin", "caddy-plain")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("plain caddy binary %s missing: run `make caddy-plain` first (%v)", bin, err)
	}
	return bin
}

// reloadSite is config generation GEN: keys K_GEN (current) and
// K_PREV, store STORE. The keys are literal hex in a private temp file.
const reloadSite = siteGlobals + `http://127.0.0.1:{{PORT}} {
	header X-Gen GEN
	syncular_segments /segments/* {
		key hex:KEY_CUR hex:KEY_PREV
		audience template aud:{partition}
		store sqlite STORE
		untokened reject
		# bytes from SQLite on every request: the pool is what is tested
		cache {
			max_bytes 0
		}
	}
	respond "not the segment handler" 418
}
`

const plainSite = `{
	admin 127.0.0.1:{{ADMIN}}
	default_bind 127.0.0.1
}

http://127.0.0.1:{{PORT}} {
	header X-Gen GEN
	root * ROOT
	file_server
}
`

// loadStats is what the download loop saw.
type loadStats struct {
	ok, refusedLegit, connErrors, cut, wrong atomic.Int64
	mu                                       sync.Mutex
	samples                                  []string
}

func (s *loadStats) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < 5 {
		s.samples = append(s.samples, fmt.Sprintf(format, args...))
	}
}

func (s *loadStats) String() string {
	return fmt.Sprintf("%d ok, %d legitimately refused, %d connection errors, %d bodies cut, %d wrong %v",
		s.ok.Load(), s.refusedLegit.Load(), s.connErrors.Load(), s.cut.Load(), s.wrong.Load(), s.samples)
}

// downloadLoop runs workers GET loops until stop is closed (bounded by
// maxPerWorker requests each). url gives the URL to fetch and the
// generation it was built for; check judges a full answer.
func downloadLoop(workers, maxPerWorker int, stop <-chan struct{}, st *loadStats,
	url func(w, i int) (string, int64), gen func() int64, check func(res *http.Response, body []byte, builtGen int64) bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 2}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			for i := 0; i < maxPerWorker; i++ {
				select {
				case <-stop:
					return
				default:
				}
				u, built := url(w, i)
				res, err := hc.Get(u)
				if err != nil {
					st.connErrors.Add(1)
					st.note("request error: %v", err)
					continue
				}
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil {
					st.cut.Add(1)
					st.note("body cut after %d bytes: %v", len(body), err)
					continue
				}
				if !check(res, body, built) {
					st.wrong.Add(1)
					st.note("wrong answer %d (gen built %d, now %d, X-Gen %s) at %s: %.200s", res.StatusCode, built, gen(),
						res.Header.Get("X-Gen"), time.Now().UTC().Format("15:04:05.000"), body)
				}
			}
		}()
	}
	return &wg
}

// TestReloads: 20 reloads, each changing the keys and switching the
// store between two copies of the file, while downloads run. Every
// completed request is right, no download is cut, new keys work as soon
// as the reload returns, removed keys stop working, fds come back, a
// reload or validate to a broken store fails cleanly and changes nothing.
// Stock Caddy serving a static file under the same reload storm is the
// baseline for connection errors.
func TestReloads(t *testing.T) {
	dir := t.TempDir()
	big := pseudoRandom(4<<20, 7)
	small := pseudoRandom(2<<10, 8)
	storeA := filepath.Join(dir, "a.db")
	ids := seedStore(t, storeA, "wal", big, small)
	storeB := filepath.Join(dir, "b.db")
	if got := seedStore(t, storeB, "wal", big, small); got[0] != ids[0] {
		t.Fatal("copies differ")
	}
	bigID, smallID := ids[0], ids[1]
	keys := make([]string, reloadCount+3)
	for i := range keys {
		keys[i] = randKey(t)
	}
	rawKey := func(g int64) []byte { b, _ := hex.DecodeString(keys[g]); return b }
	config := func(g int64) string {
		st := storeA
		if g%2 == 1 {
			st = storeB
		}
		prev := keys[max(g-1, 0)]
		return strings.NewReplacer("GEN", fmt.Sprint(g), "KEY_CUR", keys[g], "KEY_PREV", prev, "STORE", st).Replace(reloadSite)
	}
	tokURL := func(base string, g int64, id string) string {
		tok := token.Sign(rawKey(g), id, hardDigest, hardAud, time.Now().Add(10*time.Minute).Unix())
		return base + "/segments/" + id + "?st=" + tok
	}

	// ---- ours ----
	c := startCaddy(t, config(1))
	var gen atomic.Int64 // the generation whose reload has returned
	gen.Store(1)
	checkSegment(t, do(t, "GET", tokURL(c.Base, 1, bigID), nil), bigID)
	// Warm the store's connection pool under the same concurrency before
	// the baseline.
	warm := hammer(40, 4, 30*time.Second, func(i int) string {
		if i%2 == 0 {
			return tokURL(c.Base, 1, smallID)
		}
		return tokURL(c.Base, 1, bigID)
	})
	if warm[200] != 40 {
		t.Fatalf("warm-up: %v", warm)
	}
	before := c.resources(t)

	ours := &loadStats{}
	stop := make(chan struct{})
	wg := downloadLoop(4, 2000, stop, ours, func(w, i int) (string, int64) {
		g := gen.Load()
		id := bigID
		if i%3 == 2 {
			id = smallID
		}
		return tokURL(c.Base, g, id), g
	}, gen.Load, func(res *http.Response, body []byte, built int64) bool {
		id := bigID
		if len(body) == len(small) || (res.StatusCode == 200 && len(body) != len(big)) {
			id = smallID
		}
		switch res.StatusCode {
		case 200:
			sum := sha256.Sum256(body)
			if "sha256:"+hex.EncodeToString(sum[:]) != id {
				return false
			}
			ours.ok.Add(1)
			return true
		case 403:
			// Legitimate only if the key was removed: two reloads
			// returned since the token was signed.
			if gen.Load() >= built+2 && bytes.Contains(body, []byte(`"sync.forbidden"`)) {
				ours.refusedLegit.Add(1)
				return true
			}
		}
		return false
	})

	var reloadTimes []time.Duration
	for g := int64(2); g <= reloadCount+1; g++ {
		time.Sleep(250 * time.Millisecond)
		start := time.Now()
		if err := c.Reload(config(g)); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("reload %d: %v", g, err)
		}
		reloadTimes = append(reloadTimes, time.Since(start))
		gen.Store(g)
		// The new key works at once; the key two generations back is gone.
		r := do(t, "GET", tokURL(c.Base, g, smallID), nil)
		if r.Status != 200 || r.Header.Get("X-Gen") != fmt.Sprint(g) {
			t.Errorf("reload %d: new key answered %d (X-Gen %q): %s", g, r.Status, r.Header.Get("X-Gen"), r.Body)
		}
		if g >= 3 {
			checkError(t, do(t, "GET", tokURL(c.Base, g-2, smallID), nil), 403, "sync.forbidden")
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("ours: %d reloads (median %s), downloads: %s", reloadCount, reloadTimes[len(reloadTimes)/2].Round(time.Millisecond), ours)
	if ours.wrong.Load() != 0 || ours.cut.Load() != 0 {
		t.Errorf("ours: wrong or cut downloads across reloads: %s", ours)
		for _, line := range strings.Split(readFile(t, filepath.Join(c.Dir(), "server.log")), "\n") {
			if strings.Contains(line, "fault") || strings.Contains(line, "error") {
				t.Logf("server log: %s", line)
			}
		}
	}
	if ours.ok.Load() < 40 {
		t.Errorf("ours: only %d downloads completed", ours.ok.Load())
	}

	// A reload to a store that cannot be opened fails and changes nothing;
	// so does caddy validate.
	g := gen.Load()
	brokenCfg := strings.Replace(config(g+1), "store sqlite "+storeA, "store sqlite "+filepath.Join(dir, "missing.db"), 1)
	brokenCfg = strings.Replace(brokenCfg, "store sqlite "+storeB, "store sqlite "+filepath.Join(dir, "missing.db"), 1)
	if err := c.Reload(brokenCfg); err == nil {
		t.Errorf("reload to a missing store succeeded")
	} else if !strings.Contains(err.Error(), "opening sqlite store") {
		t.Errorf("reload error does not name the store: %v", err)
	}
	if err := c.Reload(strings.Replace(config(g+1), "\t\tuntokened reject\n", "\t\tuntokened reject\n\t\tstore sqlite /x\n", 1)); err == nil {
		t.Errorf("reload to a config with two store lines succeeded")
	}
	r := do(t, "GET", tokURL(c.Base, g, bigID), nil)
	checkSegment(t, r, bigID)
	if r.Header.Get("X-Gen") != fmt.Sprint(g) {
		t.Errorf("running config changed after failed reloads: X-Gen %q", r.Header.Get("X-Gen"))
	}
	checkError(t, do(t, "GET", tokURL(c.Base, g+1, bigID), nil), 403, "sync.forbidden")
	vcfg := filepath.Join(c.Dir(), "broken.Caddyfile")
	// Without the log block, so the error reaches the command's output.
	vtext := strings.Replace(c.render(brokenCfg), "\tlog {\n\t\tlevel INFO\n\t\toutput file "+c.Dir()+"/server.log\n\t}\n", "", 1)
	if err := os.WriteFile(vcfg, []byte(vtext), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(c.bin, "validate", "--config", vcfg, "--adapter", "caddyfile").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "opening sqlite store") || strings.Contains(string(out), "panic") {
		t.Errorf("caddy validate of a missing store: err %v\n%s", err, out)
	}
	for _, text := range []string{c.Output(), readFile(t, filepath.Join(c.Dir(), "server.log"))} {
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, "panic") {
				t.Errorf("a panic was logged: %s", line)
			}
		}
	}

	after := c.settleTo(t, before, 2, 5)
	t.Logf("ours: before the reloads %s, after %s", before, after)
	if after.FDs > before.FDs+2 || after.Goroutines > before.Goroutines+5 {
		t.Errorf("leak across reloads: before %s, after %s", before, after)
	}
	// Store-file fds: none may stay on the copy the running config no
	// longer uses (its pool entry must have been destructed).
	storeFDs := func(path string) int {
		n := 0
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.pid()))
		for _, e := range ents {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", c.pid(), e.Name())); err == nil && strings.HasPrefix(l, path) {
				n++
			}
		}
		return n
	}
	active, inactive := storeA, storeB
	if g%2 == 1 {
		active, inactive = storeB, storeA
	}
	t.Logf("ours: fds on the active store file %d, on the other copy %d", storeFDs(active), storeFDs(inactive))
	if n := storeFDs(inactive); n != 0 {
		t.Errorf("%d fds still open on the store the running config no longer uses", n)
	}

	// ---- plain Caddy, same storm, static file ----
	root := filepath.Join(dir, "www")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "small"), small, 0o644); err != nil {
		t.Fatal(err)
	}
	plainCfg := func(g int64) string {
		return strings.NewReplacer("GEN", fmt.Sprint(g), "ROOT", root).Replace(plainSite)
	}
	p := startCaddyBin(t, plainCaddyBinary(t), plainCfg(1))
	plain := &loadStats{}
	stop = make(chan struct{})
	wg = downloadLoop(4, 2000, stop, plain, func(w, i int) (string, int64) {
		if i%3 == 2 {
			return p.Base + "/small", 0
		}
		return p.Base + "/big", 0
	}, func() int64 { return 0 }, func(res *http.Response, body []byte, _ int64) bool {
		if res.StatusCode == 200 && (bytes.Equal(body, big) || bytes.Equal(body, small)) {
			plain.ok.Add(1)
			return true
		}
		return false
	})
	for g := int64(2); g <= reloadCount+1; g++ {
		time.Sleep(250 * time.Millisecond)
		if err := p.Reload(plainCfg(g)); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("plain reload %d: %v", g, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("plain: %d reloads, downloads: %s", reloadCount, plain)
	oursErr := ours.connErrors.Load() + ours.cut.Load()
	plainErr := plain.connErrors.Load() + plain.cut.Load()
	t.Logf("connection errors during %d reloads: plain Caddy %d, ours %d", reloadCount, plainErr, oursErr)
	if oursErr > plainErr+2 {
		t.Errorf("ours adds connection errors across reloads: %d vs plain %d", oursErr, plainErr)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}
