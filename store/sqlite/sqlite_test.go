package sqlite_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/sqlite"
)

// vectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func vectorsDir(t testing.TB) string { return testkit.VectorsDir(t) }

// copyVector copies a vector database into a fresh temp dir (the vectors
// dir is read-only, and WAL needs a writable one) and returns its path.
func copyVector(t testing.TB, name string) string {
	t.Helper()
	return copyFile(t, filepath.Join(vectorsDir(t), name), filepath.Join(t.TempDir(), name))
}

func copyFile(t testing.TB, src, dst string) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func readJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func readAll(t testing.TB, s store.Store, id string, off, n int64) ([]byte, error) {
	t.Helper()
	rc, err := s.Open(context.Background(), idOf(id), off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vectorRecord is a record as the reference get() returned it: the §4
// publication fields plus segmentId. logEpoch is absent in gen-1 output.
type vectorRecord struct {
	store.Publication
	SegmentID string `json:"segmentId"`
}

type vectorGet struct {
	SegmentID string `json:"segmentId"`
	Result    *struct {
		Record   vectorRecord `json:"record"`
		BytesHex string       `json:"bytesHex"`
	} `json:"result"`
}

// checkGet asserts that Lookup and Open answer like the reference get():
// one derived publication equal to the stored record, or ErrNotFound.
func checkGet(t *testing.T, s *sqlite.Store, g vectorGet) {
	t.Helper()
	ctx := context.Background()
	rec, err := s.Lookup(ctx, idOf(g.SegmentID))
	if g.Result == nil {
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Lookup(%q) = %v, %v; want ErrNotFound", g.SegmentID, rec, err)
		}
		if _, err := s.Open(ctx, idOf(g.SegmentID), 0, -1); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Open(%q) = %v; want ErrNotFound", g.SegmentID, err)
		}
		return
	}
	if err != nil {
		t.Errorf("Lookup(%s): %v", g.SegmentID, err)
		return
	}
	want := g.Result.Record
	if rec.SegmentID != g.SegmentID || rec.ByteLength != want.ByteLength || rec.MediaType != want.MediaType {
		t.Errorf("Lookup(%s) = {%s %d %s}, want {%s %d %s}", g.SegmentID,
			rec.SegmentID, rec.ByteLength, rec.MediaType, want.SegmentID, want.ByteLength, want.MediaType)
	}
	if !reflect.DeepEqual(rec.Publications, []store.Publication{want.Publication}) {
		t.Errorf("Lookup(%s) publications:\n got %s\nwant [%s]", g.SegmentID, js(rec.Publications), js(want.Publication))
	}
	if rec.Fenced || rec.Epochs != nil {
		t.Errorf("Lookup(%s): fenced without a registry: %v %v", g.SegmentID, rec.Fenced, rec.Epochs)
	}
	body := mustHex(t, g.Result.BytesHex)
	got, err := readAll(t, s, g.SegmentID, 0, -1)
	if err != nil || !bytes.Equal(got, body) {
		t.Errorf("Open(%s) = %x, %v; want %x", g.SegmentID, got, err, body)
	}
	if sum := sha256.Sum256(got); "sha256:"+hex.EncodeToString(sum[:]) != g.SegmentID {
		t.Errorf("Open(%s): bytes hash to %x", g.SegmentID, sum)
	}
	// Sub-ranges, including past the end and empty.
	l := int64(len(body))
	for _, r := range [][2]int64{{0, 1}, {1, 3}, {l / 2, -1}, {l - 1, -1}, {l, -1}, {l + 5, 2}, {0, 0}, {2, 2 * l}, {l - 2, 1}} {
		off, n := r[0], r[1]
		if off < 0 {
			continue
		}
		lo, hi := min(off, l), l
		if n >= 0 {
			hi = min(off+n, l)
		}
		want := body[lo:max(lo, hi)]
		got, err := readAll(t, s, g.SegmentID, off, n)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Open(%s, %d, %d) = %x, %v; want %x", g.SegmentID, off, n, got, err, want)
		}
	}
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestSQLiteVectorLegacy(t *testing.T) {
	var v struct {
		Gets []vectorGet `json:"gets"`
	}
	readJSON(t, "segments-legacy.json", &v)
	if len(v.Gets) < 10 {
		t.Fatalf("%d gets in segments-legacy.json", len(v.Gets))
	}
	s := storetest.OpenSQLite(t, copyVector(t, "segments-legacy.sqlite"))
	found := 0
	for _, g := range v.Gets {
		checkGet(t, s, g)
		if g.Result != nil {
			found++
		}
	}
	t.Logf("segments-legacy: %d gets (%d records, %d not found)", len(v.Gets), found, len(v.Gets)-found)
}

type preLogEpochVector struct {
	OldPuts []struct {
		BytesHex string       `json:"bytesHex"`
		Returned vectorRecord `json:"returned"`
	} `json:"oldPuts"`
	HeadOpen struct {
		Gets                 []vectorGet  `json:"gets"`
		PutAfterMigration    vectorRecord `json:"putAfterMigration"`
		OnDiskAfterMigration struct {
			Rows []struct {
				SegmentID string `json:"segment_id"`
				Bytes     struct {
					BlobHex string `json:"blobHex"`
				} `json:"bytes"`
			} `json:"rows"`
		} `json:"onDiskAfterMigration"`
	} `json:"headOpen"`
}

// oldGets turns the as-shipped puts into expected get results (logEpoch
// absent → "").
func (v *preLogEpochVector) oldGets() []vectorGet {
	var gets []vectorGet
	for _, p := range v.OldPuts {
		g := vectorGet{SegmentID: p.Returned.SegmentID}
		g.Result = &struct {
			Record   vectorRecord `json:"record"`
			BytesHex string       `json:"bytesHex"`
		}{p.Returned, p.BytesHex}
		gets = append(gets, g)
	}
	return gets
}

// putAfterMigration is the headOpen put as a seed input and expected get.
func (v *preLogEpochVector) putAfterMigration(t *testing.T) (seed.SegmentInput, vectorGet) {
	t.Helper()
	rec := v.HeadOpen.PutAfterMigration
	var blob string
	for _, r := range v.HeadOpen.OnDiskAfterMigration.Rows {
		if r.SegmentID == rec.SegmentID {
			blob = r.Bytes.BlobHex
		}
	}
	if blob == "" {
		t.Fatal("putAfterMigration bytes not in onDiskAfterMigration")
	}
	g := vectorGet{SegmentID: rec.SegmentID}
	g.Result = &struct {
		Record   vectorRecord `json:"record"`
		BytesHex string       `json:"bytesHex"`
	}{rec, blob}
	return seed.SegmentInput{Bytes: mustHex(t, blob), Publication: rec.Publication}, g
}

func TestSQLiteVectorPreLogEpoch(t *testing.T) {
	var v preLogEpochVector
	readJSON(t, "segments-pre-logepoch.json", &v)
	if len(v.OldPuts) == 0 || len(v.HeadOpen.Gets) == 0 {
		t.Fatal("segments-pre-logepoch.json has no oldPuts or headOpen.gets")
	}

	t.Run("as shipped", func(t *testing.T) {
		s := storetest.OpenSQLite(t, copyVector(t, "segments-pre-logepoch.sqlite"))
		for _, g := range append(v.oldGets(), v.HeadOpen.Gets...) {
			checkGet(t, s, g)
		}
		_, after := v.putAfterMigration(t)
		checkGet(t, s, vectorGet{SegmentID: after.SegmentID}) // not there yet
	})

	t.Run("migrated before open", func(t *testing.T) {
		path := copyVector(t, "segments-pre-logepoch.sqlite")
		w, err := seed.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.MigrateLogEpoch(); err != nil {
			t.Fatal(err)
		}
		in, after := v.putAfterMigration(t)
		if _, err := w.Put(in); err != nil {
			t.Fatal(err)
		}
		w.Close()
		s := storetest.OpenSQLite(t, path)
		for _, g := range append(v.HeadOpen.Gets, after) {
			checkGet(t, s, g)
		}
	})

	t.Run("migrated while open", func(t *testing.T) {
		path := copyVector(t, "segments-pre-logepoch.sqlite")
		s := storetest.OpenSQLite(t, path)
		for _, g := range v.oldGets() { // the store has seen the gen-1 shape
			checkGet(t, s, g)
		}
		w, err := seed.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()

		// gen 1 → 2, the HEAD way (log_epoch appended last), then a put.
		if err := w.MigrateLogEpoch(); err != nil {
			t.Fatal(err)
		}
		in, after := v.putAfterMigration(t)
		if _, err := w.Put(in); err != nil {
			t.Fatal(err)
		}
		for _, g := range append(v.HeadOpen.Gets, after) {
			checkGet(t, s, g)
		}

		// 2 → 3: a second digest for an old row is derived from the row.
		old := v.OldPuts[0].Returned
		const dProj = "693a92157524b3387503b5d018a410ff433346f58bda85fc4b624e3c64a3f473"
		if err := w.MigrateGen3(); err != nil {
			t.Fatal(err)
		}
		if err := w.AddScope(old.SegmentID, dProj); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Lookup(context.Background(), idOf(old.SegmentID))
		if err != nil {
			t.Fatal(err)
		}
		second := old.Publication
		second.ScopeDigest = dProj
		if want := []store.Publication{old.Publication, second}; !reflect.DeepEqual(rec.Publications, want) {
			t.Errorf("derived after gen-3 migration:\n got %s\nwant %s", js(rec.Publications), js(want))
		}

		// The registry appears: fencing starts, without a restart.
		if err := w.SetEpoch("p1", "epoch-a", 1750000000003); err != nil {
			t.Fatal(err)
		}
		rec, err = s.Lookup(context.Background(), idOf(after.SegmentID))
		if err != nil {
			t.Fatal(err)
		}
		if !rec.Fenced || !reflect.DeepEqual(rec.Epochs, map[string]string{"p1": "epoch-a"}) {
			t.Errorf("after SetEpoch: Fenced=%v Epochs=%v; want true map[p1:epoch-a]", rec.Fenced, rec.Epochs)
		}

		// An explicit publication row now rules over the derived ones.
		pub := old.Publication
		pub.LogEpoch, pub.ExpiresAtMs = "epoch-a", old.ExpiresAtMs+1
		if err := w.AddPublication(old.SegmentID, "k0", pub); err != nil {
			t.Fatal(err)
		}
		rec, err = s.Lookup(context.Background(), idOf(old.SegmentID))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rec.Publications, []store.Publication{pub}) {
			t.Errorf("publication rows do not rule:\n got %s\nwant [%s]", js(rec.Publications), js(pub))
		}
	})
}

// gen3Vector is segments-gen3.json (testkit.Gen3), with the helpers of
// these tests.
type gen3Vector testkit.Gen3

func (v *gen3Vector) audience(partition string) string {
	m := hmac.New(sha256.New, []byte(v.Audience.Key))
	m.Write([]byte(partition))
	return hex.EncodeToString(m.Sum(nil))
}

// gen3Pub is what the test expects of one publication in
// segments-gen3.sqlite (read off the file with an independent tool).
type gen3Pub struct {
	partition, epoch, digest string
	createdAt, expiresAt     int64
}

const (
	t0      = 1799996400000 // created
	tOld    = 1799892000000 // created, expired ones
	tLive   = 1800072000000 // expires
	tExpOld = 1799978400000 // expired
)

var gen3Want = map[string][]gen3Pub{
	"twoDigests":    {{"p1", "e1", "A", t0, tLive}, {"p1", "e1", "B", t0, tLive}},
	"twoPartitions": {{"p1", "e1", "A", tOld, tExpOld}, {"p2", "e1", "C", t0, tLive}},
	"allExpired":    {{"p1", "e1", "A", tOld, tExpOld}},
	// No publication rows: derived from the row, once per digest in
	// {row's scope_digest} ∪ sync_segment_scopes.
	"preTable":     {{"p1", "e1", "A", t0, tLive}, {"p1", "e1", "E", t0, tLive}},
	"bigImage":     {{"p2", "e1", "C", t0, tLive}},
	"expiresSoon":  {{"p1", "e1", "A", t0, 1800000000001}},
	"expiredAtNow": {{"p1", "e1", "A", t0, 1800000000000}},
	"staleEpoch":   {{"p1", "e0", "A", t0, tLive}},
	"unregistered": {{"p3-unregistered", "e1", "A", t0, tLive}},
}

func TestSQLiteVectorGen3Publications(t *testing.T) {
	var v gen3Vector
	readJSON(t, "segments-gen3.json", &v)
	if len(v.Segments) != len(gen3Want) {
		t.Fatalf("segments-gen3.json has %d segments, the test knows %d", len(v.Segments), len(gen3Want))
	}
	s := storetest.OpenSQLite(t, copyVector(t, "segments-gen3.sqlite"))
	for name, seg := range v.Segments {
		want, ok := gen3Want[name]
		if !ok {
			t.Errorf("segment %s unknown to the test", name)
			continue
		}
		rec, err := s.Lookup(context.Background(), idOf(seg.SegmentID))
		if err != nil {
			t.Errorf("%s: Lookup: %v", name, err)
			continue
		}
		if rec.SegmentID != seg.SegmentID || rec.ByteLength != int64(seg.ByteLength) || rec.MediaType != seg.MediaType {
			t.Errorf("%s: record {%s %d %s}, want {%s %d %s}", name, rec.SegmentID, rec.ByteLength,
				rec.MediaType, seg.SegmentID, seg.ByteLength, seg.MediaType)
		}
		var got []gen3Pub
		wantEpochs := map[string]string{}
		for _, p := range rec.Publications {
			digest := p.ScopeDigest
			for k, d := range v.ScopeDigests {
				if d == p.ScopeDigest {
					digest = k
				}
			}
			got = append(got, gen3Pub{p.Partition, p.LogEpoch, digest, p.CreatedAtMs, p.ExpiresAtMs})
			if p.Table != "tasks" || p.SchemaVersion != 3 || p.AsOfCommitSeq != 40 || p.RowCount != 10 ||
				p.RowCursor != nil || p.NextRowCursor != nil || p.ByteLength != int64(seg.ByteLength) || p.MediaType != seg.MediaType {
				t.Errorf("%s: publication fields %s", name, js(p))
			}
			if e, ok := v.Registry[p.Partition]; ok {
				wantEpochs[p.Partition] = e
			}
		}
		sort.Slice(got, func(i, j int) bool { return fmt.Sprint(got[i]) < fmt.Sprint(got[j]) })
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: publications\n got %v\nwant %v", name, got, want)
		}
		if !rec.Fenced || !reflect.DeepEqual(rec.Epochs, wantEpochs) {
			t.Errorf("%s: Fenced=%v Epochs=%v; want true %v", name, rec.Fenced, rec.Epochs, wantEpochs)
		}
		body, err := readAll(t, s, seg.SegmentID, 0, -1)
		sum := sha256.Sum256(body)
		if err != nil || hex.EncodeToString(sum[:]) != seg.BytesSha256 || len(body) != seg.ByteLength {
			t.Errorf("%s: Open: %d bytes hashing to %x, %v", name, len(body), sum, err)
		}
	}
}

// tokenClaims does what the token layer does before the store is asked
// (protocol §2, §3): a well-formed path id, a token whose MAC verifies
// under one of the keys, v 1, exp within skew, seg == path id. It returns
// the claims the store's grant check needs, or why the case is the token
// layer's to decide.
func (v *gen3Vector) tokenClaims(path string, token *string) (id, sd, aud, reason string) {
	id, err := url.PathUnescape(path[strings.LastIndexByte(path, '/')+1:])
	if err != nil || !segid.Valid(id) {
		return "", "", "", "malformed segment id in path"
	}
	if token == nil {
		return "", "", "", "no token (direct path)"
	}
	payloadB64, macB64, ok := strings.Cut(*token, ".")
	if !ok {
		return "", "", "", "malformed token"
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(payloadB64)
	mac, err2 := base64.RawURLEncoding.DecodeString(macB64)
	if err1 != nil || err2 != nil {
		return "", "", "", "token not base64url"
	}
	macOK := false
	for _, k := range []string{v.Keys.Current, v.Keys.Previous} {
		m := hmac.New(sha256.New, []byte(k))
		m.Write(payload)
		macOK = macOK || hmac.Equal(m.Sum(nil), mac)
	}
	if !macOK {
		return "", "", "", "bad MAC"
	}
	var c struct {
		V   any    `json:"v"`
		Seg string `json:"seg"`
		SD  string `json:"sd"`
		Aud string `json:"aud"`
		Exp any    `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", "", "", "unparseable claims"
	}
	if c.V != float64(1) {
		return "", "", "", "unsupported token version"
	}
	if exp, ok := c.Exp.(float64); !ok || exp < float64(v.NowMs)/1000-60 {
		return "", "", "", "token expired"
	}
	if c.Seg != id {
		return "", "", "", "segment mismatch"
	}
	return id, c.SD, c.Aud, ""
}

// TestSQLiteVectorGen3Grant drives every case of segments-gen3.json whose
// answer depends on the store through Lookup + Grant (+ Open).
func TestSQLiteVectorGen3Grant(t *testing.T) {
	var v gen3Vector
	readJSON(t, "segments-gen3.json", &v)
	if v.Audience.Kind != "hmac-sha256-hex" {
		t.Fatalf("audience kind %q unknown to the test", v.Audience.Kind)
	}
	s := storetest.OpenSQLite(t, copyVector(t, "segments-gen3.sqlite"))
	ran, tokenLayer := 0, 0
	for _, c := range v.Cases {
		id, sd, aud, reason := v.tokenClaims(c.Path, c.Token)
		if reason != "" {
			tokenLayer++
			t.Logf("left to the token layer: %q (%s)", c.Name, reason)
			switch c.Expect.Status {
			case float64(403), float64(404), "next-handler":
			default:
				t.Errorf("%q: token-layer case expects %v", c.Name, c.Expect.Status)
			}
			continue
		}
		ran++
		var out store.Outcome
		var until int64
		rec, err := s.Lookup(context.Background(), idOf(id))
		switch {
		case errors.Is(err, store.ErrNotFound):
			out = store.NotFound
		case err != nil:
			t.Errorf("%q: Lookup: %v", c.Name, err)
			continue
		default:
			res := store.Grant(rec, sd, aud, v.audience, v.NowMs)
			out, until = res.Outcome, res.UntilMs
		}
		var want store.Outcome
		switch {
		case c.Expect.Status == float64(200):
			want = store.Granted
		case c.Expect.Code == "sync.forbidden":
			want = store.Forbidden
		case c.Expect.Code == "sync.not_found":
			want = store.NotFound
		case c.Expect.Code == "sync.segment_expired":
			want = store.Expired
		default:
			t.Errorf("%q: unknown expectation %+v", c.Name, c.Expect)
			continue
		}
		if out != want {
			t.Errorf("%q: outcome %v, want %v", c.Name, out, want)
			continue
		}
		if want != store.Granted {
			continue
		}
		if until <= v.NowMs {
			t.Errorf("%q: granted until %d, not after now", c.Name, until)
		}
		seg, ok := v.Segments[c.Expect.Segment]
		if !ok || seg.SegmentID != id {
			t.Errorf("%q: expected segment %q is not %s", c.Name, c.Expect.Segment, id)
			continue
		}
		body, err := readAll(t, s, id, 0, -1)
		sum := sha256.Sum256(body)
		if err != nil || "sha256:"+hex.EncodeToString(sum[:]) != id {
			t.Errorf("%q: Open: %d bytes hashing to %x, %v", c.Name, len(body), sum, err)
		}
	}
	t.Logf("segments-gen3: %d cases run through the store, %d left to the token layer", ran, tokenLayer)
	if ran+tokenLayer != len(v.Cases) || ran < 12 {
		t.Errorf("ran %d of %d cases (%d token-layer); want at least 12 through the store", ran, len(v.Cases), tokenLayer)
	}
}

func BenchmarkSQLiteLookup(b *testing.B) {
	for _, bc := range []struct{ name, file, id string }{
		{"gen3", "segments-gen3.sqlite", "sha256:33016ca4ff1ec281affb6d0d501780886b41ce55f64eff8c213b352a67283d50"},
		{"gen3-derived", "segments-gen3.sqlite", "sha256:7e1d002d319a36143cc563c45c2762ebba95b4aea2f9263e670249138885d45a"},
		{"legacy", "segments-legacy.sqlite", "sha256:7f0c8977715491126054902410407981f462d1afa386d3390ba6763a21746859"},
		{"miss", "segments-gen3.sqlite", "sha256:0000000000000000000000000000000000000000000000000000000000000000"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := storetest.OpenSQLite(b, copyVector(b, bc.file))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Lookup(ctx, idOf(bc.id)); err != nil && !errors.Is(err, store.ErrNotFound) {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("gen3-wal", func(b *testing.B) {
		// A seeded WAL file, as the live sync server keeps it.
		path := filepath.Join(b.TempDir(), "wal.sqlite")
		w, err := seed.Create(path, 3)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		p := store.Publication{Partition: "p1", LogEpoch: "e1", Table: "tasks", ScopeDigest: strings.Repeat("a", 64)}
		id, err := w.Put(seed.SegmentInput{Bytes: make([]byte, 2008), Publication: p})
		if err != nil {
			b.Fatal(err)
		}
		p.ScopeDigest = strings.Repeat("b", 64)
		if err := w.AddPublication(id, "", p); err != nil {
			b.Fatal(err)
		}
		if err := w.SetEpoch("p1", "e1", 1); err != nil {
			b.Fatal(err)
		}
		s := storetest.OpenSQLite(b, path)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Lookup(ctx, idOf(id)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gen3-parallel", func(b *testing.B) {
		s := storetest.OpenSQLite(b, copyVector(b, "segments-gen3.sqlite"))
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Lookup(ctx, idOf("sha256:33016ca4ff1ec281affb6d0d501780886b41ce55f64eff8c213b352a67283d50")); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkSQLiteOpen(b *testing.B) {
	for _, bc := range []struct {
		name string
		id   string
		n    int64
	}{
		{"2KB", "sha256:33016ca4ff1ec281affb6d0d501780886b41ce55f64eff8c213b352a67283d50", -1},
		{"300KB", "sha256:6b196aadcb8be58447d855d7c3c305ec7e1b80bc7184aa1364813ca6ac321a1a", -1},
		{"300KB-range-4KB", "sha256:6b196aadcb8be58447d855d7c3c305ec7e1b80bc7184aa1364813ca6ac321a1a", 4096},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := storetest.OpenSQLite(b, copyVector(b, "segments-gen3.sqlite"))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				rc, err := s.Open(ctx, idOf(bc.id), 1000, bc.n)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, rc); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
		})
	}
}
