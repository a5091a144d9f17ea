package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/storetest"
	"github.com/syncular/caddy-syncular/internal/testkit"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
)

// ---- vectors ----------------------------------------------------------

type s3VecPut struct {
	Name                    string          `json:"name"`
	Store                   string          `json:"store"`
	BytesHex                string          `json:"bytesHex"`
	ObjectKey               string          `json:"objectKey"`
	RecordHeaderValue       string          `json:"recordHeaderValue"`
	RecordHeaderDecodedJSON string          `json:"recordHeaderDecodedJson"`
	Returned                json.RawMessage `json:"returned"`
}

type s3VecGet struct {
	Store     string `json:"store"`
	SegmentID string `json:"segmentId"`
	Result    *struct {
		Record   json.RawMessage `json:"record"`
		BytesHex string          `json:"bytesHex"`
	} `json:"result"`
}

type s3Vectors struct {
	FrozenNowMs int64 `json:"frozenNowMs"`
	Stores      map[string]struct {
		KeyPrefix *string `json:"keyPrefix"`
	} `json:"stores"`
	Puts    []s3VecPut `json:"puts"`
	Gets    []s3VecGet `json:"gets"`
	Objects []struct {
		Key     string            `json:"key"`
		Headers map[string]string `json:"headers"`
	} `json:"objects"`
}

// s3VectorsDir is testkit.VectorsDir: the protocol vectors, or a failed test.
func s3VectorsDir(t testing.TB) string { return testkit.VectorsDir(t) }

func s3LoadJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s3VectorsDir(t), name))
	if err != nil {
		t.Fatalf("vectors: %v (set SYNCULAR_VECTORS)", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("vectors: %s: %v", name, err)
	}
}

func s3LoadVectors(t testing.TB) *s3Vectors {
	t.Helper()
	var v s3Vectors
	s3LoadJSON(t, "s3-objects.json", &v)
	if len(v.Puts) == 0 || len(v.Gets) == 0 {
		t.Fatal("vectors: s3-objects.json has no puts/gets")
	}
	return &v
}

// s3WantRecord is the record the edge must read from a reference record
// JSON without publications/scopeDigests: one publication of its fields.
func s3WantRecord(t testing.TB, recordJSON []byte) *store.Record {
	t.Helper()
	var r struct {
		store.Publication
		SegmentID string `json:"segmentId"`
	}
	dec := json.NewDecoder(bytes.NewReader(recordJSON))
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("vector record: %v", err)
	}
	return &store.Record{
		SegmentID:    r.SegmentID,
		ByteLength:   r.ByteLength,
		MediaType:    r.MediaType,
		Publications: []store.Publication{r.Publication},
	}
}

func s3CheckRecord(t testing.TB, got, want *store.Record) {
	t.Helper()
	if got == nil {
		t.Fatalf("record: got nil, want %+v", want)
	}
	if got.Fenced || got.Epochs != nil {
		t.Errorf("record: S3 records are never fenced: %+v", got)
	}
	if !reflect.DeepEqual(got, want) {
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(want)
		t.Errorf("record:\n got  %s\n want %s", gj, wj)
	}
}

func TestS3DecodeVectors(t *testing.T) {
	v := s3LoadVectors(t)
	for _, p := range v.Puts {
		t.Run(p.Name, func(t *testing.T) {
			// The decoded JSON in the vector is the header decoded.
			raw, err := base64.RawURLEncoding.DecodeString(p.RecordHeaderValue)
			if err != nil || string(raw) != p.RecordHeaderDecodedJSON {
				t.Fatalf("vector inconsistent: %v", err)
			}
			want := s3WantRecord(t, []byte(p.RecordHeaderDecodedJSON))
			// ... and what the reference put returned.
			if ret := s3WantRecord(t, p.Returned); !reflect.DeepEqual(ret, want) {
				t.Fatalf("vector inconsistent: returned %+v", ret)
			}
			got, err := s3.DecodeRecord(p.RecordHeaderValue, want.SegmentID)
			if err != nil {
				t.Fatal(err)
			}
			s3CheckRecord(t, got, want)
			if !strings.HasSuffix(p.ObjectKey, strings.Replace(want.SegmentID, ":", "/", 1)) {
				t.Errorf("object key %s", p.ObjectKey)
			}
		})
	}
	// The final bucket's object headers decode too.
	n := 0
	for _, o := range v.Objects {
		h, ok := o.Headers["x-amz-meta-syncular-record"]
		if !ok {
			continue
		}
		n++
		id := "sha256:" + o.Key[strings.LastIndexByte(o.Key, '/')+1:]
		raw, _ := base64.RawURLEncoding.DecodeString(h)
		got, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		s3CheckRecord(t, got, s3WantRecord(t, raw))
	}
	if n == 0 {
		t.Fatal("no objects with a record header in the vectors")
	}
}

func TestS3DecodeOldFormatWithoutLogEpoch(t *testing.T) {
	var v struct {
		OldS3 struct {
			ObjectKey               string `json:"objectKey"`
			RecordHeaderValue       string `json:"recordHeaderValue"`
			RecordHeaderDecodedJSON string `json:"recordHeaderDecodedJson"`
		} `json:"oldS3"`
	}
	s3LoadJSON(t, "segments-pre-logepoch.json", &v)
	if strings.Contains(v.OldS3.RecordHeaderDecodedJSON, "logEpoch") {
		t.Fatal("vector is expected to lack logEpoch")
	}
	want := s3WantRecord(t, []byte(v.OldS3.RecordHeaderDecodedJSON))
	got, err := s3.DecodeRecord(v.OldS3.RecordHeaderValue, want.SegmentID)
	if err != nil {
		t.Fatal(err)
	}
	s3CheckRecord(t, got, want)
	if got.Publications[0].LogEpoch != "" {
		t.Errorf("logEpoch = %q, want empty", got.Publications[0].LogEpoch)
	}
}

// s3Rec builds a record JSON object from the first vector put, edited.
func s3Rec(t testing.TB, edit func(m map[string]any)) (header, id string) {
	t.Helper()
	v := s3LoadVectors(t)
	var m map[string]any
	if err := json.Unmarshal([]byte(v.Puts[0].RecordHeaderDecodedJSON), &m); err != nil {
		t.Fatal(err)
	}
	id = m["segmentId"].(string)
	if edit != nil {
		edit(m)
	}
	return s3test.RecordHeader(m), id
}

func TestS3DecodeCorrupt(t *testing.T) {
	const secretPartition = "PARTITION-MUST-NOT-LEAK"
	_, id := s3Rec(t, nil)
	other := "sha256:" + strings.Repeat("0", 64)
	cases := map[string]func(m map[string]any){
		"segmentId mismatch":          func(m map[string]any) { m["segmentId"] = other },
		"segmentId missing":           func(m map[string]any) { delete(m, "segmentId") },
		"partition missing":           func(m map[string]any) { delete(m, "partition") },
		"partition not string":        func(m map[string]any) { m["partition"] = 7 },
		"logEpoch null":               func(m map[string]any) { m["logEpoch"] = nil },
		"table missing":               func(m map[string]any) { delete(m, "table") },
		"scopeDigest null":            func(m map[string]any) { m["scopeDigest"] = nil },
		"schemaVersion string":        func(m map[string]any) { m["schemaVersion"] = "3" },
		"asOfCommitSeq float":         func(m map[string]any) { m["asOfCommitSeq"] = 4.5 },
		"rowCount missing":            func(m map[string]any) { delete(m, "rowCount") },
		"byteLength negative":         func(m map[string]any) { m["byteLength"] = -1 },
		"byteLength missing":          func(m map[string]any) { delete(m, "byteLength") },
		"createdAtMs bool":            func(m map[string]any) { m["createdAtMs"] = true },
		"expiresAtMs missing":         func(m map[string]any) { delete(m, "expiresAtMs") },
		"expiresAtMs null":            func(m map[string]any) { m["expiresAtMs"] = nil },
		"mediaType unknown":           func(m map[string]any) { m["mediaType"] = "csv" },
		"rowCursor number":            func(m map[string]any) { m["rowCursor"] = 1 },
		"nextRowCursor missing":       func(m map[string]any) { delete(m, "nextRowCursor") },
		"scopeDigests not list":       func(m map[string]any) { m["scopeDigests"] = "abc" },
		"scopeDigests holds a number": func(m map[string]any) { m["scopeDigests"] = []any{"a", 1} },
		"publications not list":       func(m map[string]any) { m["publications"] = map[string]any{} },
		"publications null":           func(m map[string]any) { m["publications"] = nil },
		"publication not object":      func(m map[string]any) { m["publications"] = []any{"x"} },
		"publication missing field": func(m map[string]any) {
			p := s3Pub(m, "p1", "d", 1)
			delete(p, "expiresAtMs")
			m["publications"] = []any{p}
		},
		"publication byteLength differs": func(m map[string]any) {
			p := s3Pub(m, "p1", "d", 1)
			p["byteLength"] = 999
			m["publications"] = []any{p}
		},
		"publication bad mediaType": func(m map[string]any) {
			p := s3Pub(m, "p1", "d", 1)
			p["mediaType"] = "ROWS"
			m["publications"] = []any{p}
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			h, _ := s3Rec(t, func(m map[string]any) {
				m["partition"] = secretPartition
				edit(m)
			})
			s3CheckCorrupt(t, h, id, secretPartition)
		})
	}
	raw := map[string]string{
		"empty":           "",
		"blank":           "   ",
		"not base64":      "!!!not-base64!!!",
		"bad padding":     base64.RawURLEncoding.EncodeToString([]byte(`{"a":1}`)) + "===",
		"not json":        base64.RawURLEncoding.EncodeToString([]byte("not json")),
		"json null":       base64.RawURLEncoding.EncodeToString([]byte("null")),
		"json array":      base64.RawURLEncoding.EncodeToString([]byte("[1,2]")),
		"trailing data":   base64.RawURLEncoding.EncodeToString([]byte(`{"segmentId":"x"} {}`)),
		"case-folded key": s3Must(s3Rec(t, func(m map[string]any) { m["SegmentId"] = m["segmentId"]; delete(m, "segmentId") })),
	}
	for name, h := range raw {
		t.Run(name, func(t *testing.T) { s3CheckCorrupt(t, h, id, secretPartition) })
	}
	t.Run("invalid requested id", func(t *testing.T) {
		h, _ := s3Rec(t, nil)
		s3CheckCorrupt(t, h, "sha256:ABC", secretPartition)
	})
}

func s3Must(h, _ string) string { return h }

func s3CheckCorrupt(t testing.TB, header, id, secret string) {
	t.Helper()
	rec, err := s3.DecodeRecord(header, id)
	if err == nil {
		t.Fatalf("decoded a corrupt record: %+v", rec)
	}
	if rec != nil {
		t.Errorf("record returned with an error")
	}
	if !errors.Is(err, store.ErrCorruptRecord) || errors.Is(err, store.ErrNotFound) {
		t.Errorf("error %v: want ErrCorruptRecord, not ErrNotFound", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks a field value: %v", err)
	}
}

// s3Pub is a publication object derived from record m.
func s3Pub(m map[string]any, partition, digest string, expiresAtMs int64) map[string]any {
	p := map[string]any{}
	for _, k := range []string{"logEpoch", "table", "schemaVersion", "mediaType", "asOfCommitSeq",
		"rowCount", "rowCursor", "nextRowCursor", "byteLength", "createdAtMs"} {
		p[k] = m[k]
	}
	p["partition"] = partition
	p["scopeDigest"] = digest
	p["expiresAtMs"] = expiresAtMs
	return p
}

func TestS3DecodeLooseBase64(t *testing.T) {
	h, id := s3Rec(t, nil)
	want, err := s3.DecodeRecord(h, id)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(h)
	variants := map[string]string{
		"padded":       base64.URLEncoding.EncodeToString(raw),
		"std alphabet": base64.StdEncoding.EncodeToString(raw),
		"whitespace":   " " + h[:10] + "\n" + h[10:] + " ",
	}
	// A record whose base64 uses '-' and '_' in the standard form.
	for name, v := range variants {
		t.Run(name, func(t *testing.T) {
			got, err := s3.DecodeRecord(v, id)
			if err != nil {
				t.Fatal(err)
			}
			s3CheckRecord(t, got, want)
		})
	}
}

func TestS3DecodePublicationRules(t *testing.T) {
	const d1, d2, d3 = "d1", "d2", "d3"
	t.Run("scopeDigests union", func(t *testing.T) {
		h, id := s3Rec(t, func(m map[string]any) {
			m["scopeDigest"] = d1
			m["scopeDigests"] = []any{d2, d1, d3, d2}
		})
		rec, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range rec.Publications {
			got = append(got, p.ScopeDigest)
			if p.Partition != "p1" || p.ExpiresAtMs != 1750086400000 {
				t.Errorf("derived publication %+v", p)
			}
		}
		if !reflect.DeepEqual(got, []string{d1, d2, d3}) {
			t.Errorf("digests %v", got)
		}
	})
	t.Run("explicit publications rule", func(t *testing.T) {
		h, id := s3Rec(t, func(m map[string]any) {
			m["scopeDigests"] = []any{d3}
			m["publications"] = []any{s3Pub(m, "p9", d2, 5)}
		})
		rec, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Publications) != 1 || rec.Publications[0].Partition != "p9" ||
			rec.Publications[0].ScopeDigest != d2 || rec.Publications[0].ExpiresAtMs != 5 {
			t.Errorf("publications %+v", rec.Publications)
		}
	})
	t.Run("empty publications list grants nothing", func(t *testing.T) {
		// §4: an explicit list rules even when empty; the top-level fields
		// (which alone would grant p1/d1 until 1750086400000) are no fallback.
		edit := func(m map[string]any) {
			m["scopeDigest"] = d1
			m["scopeDigests"] = []any{d2}
			m["publications"] = []any{}
		}
		h, id := s3Rec(t, edit)
		fromHeader, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := base64.RawURLEncoding.DecodeString(h)
		fromObject, err := s3.DecodeRecordObject(raw, id)
		if err != nil {
			t.Fatal(err)
		}
		for name, rec := range map[string]*store.Record{"header": fromHeader, "record object": fromObject} {
			if len(rec.Publications) != 0 || rec.ByteLength == 0 {
				t.Errorf("%s: publications %+v", name, rec.Publications)
			}
			for _, d := range []string{d1, d2} {
				if out := store.Grant(rec, d, s3Audience("p1"), s3Audience, 1750000000000).Outcome; out != store.Forbidden {
					t.Errorf("%s: Grant(%s) = %v, want Forbidden", name, d, out)
				}
			}
		}
		// The same record without the list grants: the test can fail.
		h, _ = s3Rec(t, func(m map[string]any) { edit(m); delete(m, "publications") })
		rec, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatal(err)
		}
		if out := store.Grant(rec, d2, s3Audience("p1"), s3Audience, 1750000000000).Outcome; out != store.Granted {
			t.Errorf("without the list: Grant = %v, want Granted", out)
		}
	})
	t.Run("publication without logEpoch", func(t *testing.T) {
		h, id := s3Rec(t, func(m map[string]any) {
			p := s3Pub(m, "p9", d2, 5)
			delete(p, "logEpoch")
			m["publications"] = []any{p}
		})
		rec, err := s3.DecodeRecord(h, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Publications[0].LogEpoch != "" {
			t.Errorf("publications %+v", rec.Publications)
		}
	})
}

// ---- against a real versitygw -----------------------------------------

func s3Audience(p string) string { return "aud:" + p }

func s3Prefix(v *s3Vectors, storeName string) string {
	if p := v.Stores[storeName].KeyPrefix; p != nil {
		return *p
	}
	return ""
}

// TestS3StoreLookupVectors replays the reference puts into versitygw
// (region "auto", as R2) and reads every reference get back.
func TestS3StoreLookupVectors(t *testing.T) {
	v := s3LoadVectors(t)
	srv := s3test.Start(t, s3test.WithRegion("auto"))
	srv.CreateBucket(t, storetest.S3Bucket)
	c := srv.Client()
	for _, p := range v.Puts {
		b, _ := hex.DecodeString(p.BytesHex)
		id := s3test.PutSegment(t, c, storetest.S3Bucket, s3Prefix(v, p.Store), b, p.RecordHeaderValue)
		if got := s3test.ObjectKey(s3Prefix(v, p.Store), id); got != p.ObjectKey {
			t.Fatalf("%s: key %s, reference %s", p.Name, got, p.ObjectKey)
		}
	}
	stores := map[string]*s3.Store{}
	for name := range v.Stores {
		stores[name] = storetest.S3Store(t, srv, s3Prefix(v, name), nil)
	}
	for _, g := range v.Gets {
		t.Run(g.Store+"/"+g.SegmentID, func(t *testing.T) {
			st := stores[g.Store]
			before := srv.CountRequests(t, "", "")
			rec, err := st.Lookup(context.Background(), idOf(g.SegmentID))
			if g.Result == nil {
				if !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("Lookup = %+v, %v; want ErrNotFound", rec, err)
				}
				if !segid.Valid(g.SegmentID) {
					if n := srv.CountRequests(t, "", ""); n != before {
						t.Errorf("an invalid id made %d request(s)", n-before)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := s3WantRecord(t, g.Result.Record)
			want.LegacyHeader = true // the vectors are the header layout
			s3CheckRecord(t, rec, want)
			if n := srv.CountRequests(t, "s3_HeadObject", st.ObjectKey(idOf(g.SegmentID))); n < 1 {
				t.Errorf("no HEAD of %s logged", st.ObjectKey(idOf(g.SegmentID)))
			}
			if n := srv.CountRequests(t, "s3_GetObject", st.RecordKey(idOf(g.SegmentID))); n < 1 {
				t.Errorf("no GET of %s logged", st.RecordKey(idOf(g.SegmentID)))
			}
			if n := srv.CountRequests(t, "", ""); n != before+2 {
				t.Errorf("Lookup made %d requests, want 2", n-before)
			}
			pub := want.Publications[0]
			res := store.Grant(rec, pub.ScopeDigest, s3Audience(pub.Partition), s3Audience, v.FrozenNowMs)
			out, until := res.Outcome, res.UntilMs
			wantOut := store.Granted
			if pub.ExpiresAtMs <= v.FrozenNowMs {
				wantOut = store.Expired
			}
			if out != wantOut || (out == store.Granted && until != pub.ExpiresAtMs) {
				t.Errorf("Grant = %v, %d; want %v", out, until, wantOut)
			}
			if out := store.Grant(rec, pub.ScopeDigest, "aud:other", s3Audience, v.FrozenNowMs).Outcome; out != store.Forbidden {
				t.Errorf("Grant for another audience = %v", out)
			}
		})
	}
}

func TestS3StorePublications(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	const now = int64(1750000000000)
	body := []byte("segment published three times")
	id := s3test.SegmentID(body)
	top := map[string]any{
		"partition": "p1", "logEpoch": "e1", "table": "tasks", "schemaVersion": 3, "mediaType": "rows",
		"scopeDigest": "d-user", "asOfCommitSeq": 42, "rowCount": 2, "rowCursor": nil, "nextRowCursor": nil,
		"segmentId": id, "byteLength": len(body), "createdAtMs": now - 1000, "expiresAtMs": now + 60_000,
	}
	top["publications"] = []any{
		s3Pub(top, "p1", "d-user", now+60_000),
		s3Pub(top, "p2", "d-proj", now+120_000),
		s3Pub(top, "p1", "d-old", now-1),
	}
	s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "", body, s3test.RecordHeader(top))
	st := storetest.S3Store(t, srv, "", nil)
	rec, err := st.Lookup(context.Background(), idOf(id))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) != 3 {
		t.Fatalf("publications %+v", rec.Publications)
	}
	cases := []struct {
		sd, part string
		out      store.Outcome
		until    int64
	}{
		{"d-user", "p1", store.Granted, now + 60_000},
		{"d-proj", "p2", store.Granted, now + 120_000},
		{"d-old", "p1", store.Expired, 0},
		{"d-proj", "p1", store.Forbidden, 0},
		{"d-user", "p2", store.Forbidden, 0},
	}
	for _, c := range cases {
		res := store.Grant(rec, c.sd, s3Audience(c.part), s3Audience, now)
		out, until := res.Outcome, res.UntilMs
		if out != c.out || until != c.until {
			t.Errorf("Grant(%s, %s) = %v, %d; want %v, %d", c.sd, c.part, out, until, c.out, c.until)
		}
	}
}

func TestS3StoreNotFound(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	body := []byte("soon deleted by a lifecycle rule")
	id := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "pre/", body, storetest.S3Record(body, nil))
	st := storetest.S3Store(t, srv, "pre/", nil)
	ctx := context.Background()
	if _, err := st.Lookup(ctx, idOf(id)); err != nil {
		t.Fatalf("before delete: %v", err)
	}
	s3test.DeleteSegment(t, srv.Client(), storetest.S3Bucket, "pre/", id)
	if rec, err := st.Lookup(ctx, idOf(id)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Lookup after delete = %+v, %v", rec, err)
	}
	if _, err := st.Open(ctx, idOf(id), 0, -1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Open after delete: %v", err)
	}
	if _, err := st.OpenRange(ctx, idOf(id), "bytes=0-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("OpenRange after delete: %v", err)
	}
	never := "sha256:" + strings.Repeat("ab", 32)
	if _, err := st.Lookup(ctx, idOf(never)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Lookup of a never-written id: %v", err)
	}
	// Other prefix: the object is not there.
	other := storetest.S3Store(t, srv, "other/", nil)
	id2 := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "pre/", body, storetest.S3Record(body, nil))
	if _, err := other.Lookup(ctx, idOf(id2)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Lookup under another prefix: %v", err)
	}
}

func s3AssertFault(t testing.TB, err error, secrets ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	if errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fault reported as ErrNotFound: %v", err)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(err.Error(), s) {
			t.Errorf("error leaks a secret: %v", err)
		}
	}
}

func TestS3StoreFaults(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	ctx := context.Background()
	c := srv.Client()
	st := storetest.S3Store(t, srv, "", nil)

	t.Run("neither record object nor header", func(t *testing.T) {
		// §5.2: bytes whose record is gone are not found, not a fault.
		id := s3test.PutSegment(t, c, storetest.S3Bucket, "", []byte("no header"), "")
		rec, err := st.Lookup(ctx, idOf(id))
		if !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrCorruptRecord) {
			t.Errorf("Lookup = %+v, %v; want ErrNotFound", rec, err)
		}
	})
	t.Run("corrupt record header", func(t *testing.T) {
		id := s3test.PutSegment(t, c, storetest.S3Bucket, "", []byte("bad header"), "bm90IGpzb24")
		_, err := st.Lookup(ctx, idOf(id))
		s3AssertFault(t, err)
		if !errors.Is(err, store.ErrCorruptRecord) {
			t.Errorf("want ErrCorruptRecord: %v", err)
		}
	})
	t.Run("record of another segment", func(t *testing.T) {
		body := []byte("header copied from elsewhere")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, "", body, storetest.S3Record([]byte("elsewhere"), nil))
		_, err := st.Lookup(ctx, idOf(id))
		s3AssertFault(t, err)
	})
	t.Run("length differs from byteLength", func(t *testing.T) {
		body := []byte("twenty-two bytes long!")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, "", body, storetest.S3Record(body, func(m map[string]any) { m["byteLength"] = 21 }))
		_, err := st.Lookup(ctx, idOf(id))
		s3AssertFault(t, err)
		if !errors.Is(err, store.ErrCorruptRecord) {
			t.Errorf("want ErrCorruptRecord: %v", err)
		}
	})

	body := []byte("guarded by credentials")
	id := s3test.PutSegment(t, c, storetest.S3Bucket, "", body, storetest.S3Record(body, nil))
	t.Run("wrong secret", func(t *testing.T) {
		const wrong = "wrong-secret-0123456789"
		bad := storetest.S3Store(t, srv, "", func(cfg *s3.Options) { cfg.SecretAccessKey = wrong })
		_, err := bad.Lookup(ctx, idOf(id))
		s3AssertFault(t, err, wrong, srv.SecretKey, srv.AccessKey)
		_, err = bad.Open(ctx, idOf(id), 0, -1)
		s3AssertFault(t, err, wrong, srv.SecretKey, srv.AccessKey)
		var se *s3.Error
		if !errors.As(err, &se) || se.StatusCode != 403 {
			t.Errorf("want an *Error with status 403: %#v", err)
		}
		t.Logf("wrong secret: %v", err)
	})
	t.Run("session token with wrong key", func(t *testing.T) {
		const tok = "session-token-must-not-leak"
		bad := storetest.S3Store(t, srv, "", func(cfg *s3.Options) { cfg.SessionToken = tok })
		_, err := bad.Lookup(ctx, idOf(id))
		s3AssertFault(t, err, tok, srv.SecretKey, srv.AccessKey)
	})
	t.Run("no such bucket on GET", func(t *testing.T) {
		nb := storetest.S3Store(t, srv, "", func(cfg *s3.Options) { cfg.Bucket = "no-such-bucket" })
		_, err := nb.Open(ctx, idOf(id), 0, -1)
		s3AssertFault(t, err)
	})
	t.Run("hanging server times out", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				held = append(held, c) // read nothing, answer nothing
			}
		}()
		const timeout = 700 * time.Millisecond
		hang := storetest.S3Store(t, srv, "", func(cfg *s3.Options) {
			cfg.Endpoint = "http://" + l.Addr().String()
			cfg.Timeout = timeout
		})
		for name, call := range map[string]func() error{
			"Lookup": func() error { _, err := hang.Lookup(ctx, idOf(id)); return err },
			"Open":   func() error { _, err := hang.Open(ctx, idOf(id), 0, -1); return err },
		} {
			start := time.Now()
			err := call()
			took := time.Since(start)
			s3AssertFault(t, err)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: want a deadline error: %v", name, err)
			}
			if took > timeout+4*time.Second { // unbounded without the timeout; slack for a loaded machine
				t.Errorf("%s: fault after %v, timeout %v", name, took, timeout)
			}
			t.Logf("%s: %v after %v", name, err, took.Round(time.Millisecond))
		}
	})
	t.Run("server stopped", func(t *testing.T) {
		if _, err := st.Lookup(ctx, idOf(id)); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		start := time.Now()
		_, err := st.Lookup(ctx, idOf(id))
		took := time.Since(start)
		s3AssertFault(t, err, srv.SecretKey)
		if took > 3*time.Second {
			t.Errorf("fault after %v, timeout 3s", took)
		}
		t.Logf("stopped: %v after %v", err, took.Round(time.Millisecond))
		_, err = st.Open(ctx, idOf(id), 0, -1)
		s3AssertFault(t, err)
		srv.Restart()
		if _, err := st.Lookup(ctx, idOf(id)); err != nil {
			t.Fatalf("after restart: %v", err)
		}
	})
}

func TestS3StoreCheck(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	ctx := context.Background()
	if err := storetest.S3Store(t, srv, "syncular/", nil).Check(ctx); err != nil {
		t.Fatalf("good config: %v", err)
	}
	bad := map[string]func(*s3.Options){
		"no such bucket":     func(c *s3.Options) { c.Bucket = "no-such-bucket" },
		"unknown key id":     func(c *s3.Options) { c.AccessKeyID = "UNKNOWNKEYID" },
		"wrong secret":       func(c *s3.Options) { c.SecretAccessKey = "wrong-secret-xyz" },
		"wrong region scope": func(c *s3.Options) { c.Region = "eu-west-1" },
	}
	for name, mod := range bad {
		t.Run(name, func(t *testing.T) {
			st := storetest.S3Store(t, srv, "", mod)
			err := st.Check(ctx)
			s3AssertFault(t, err, "wrong-secret-xyz", srv.SecretKey)
			t.Logf("%v", err)
			if name == "no such bucket" || name == "unknown key id" {
				// What a HEAD makes of the same fault on versitygw.
				_, err := st.Lookup(ctx, idOf("sha256:"+strings.Repeat("1", 64)))
				t.Logf("Lookup under the same fault: %v", err)
			}
		})
	}
	srv.Stop()
	s3AssertFault(t, storetest.S3Store(t, srv, "", nil).Check(ctx))
}

func TestS3StoreOpen(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	body := make([]byte, 3<<20+17)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	id := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "syncular/", body, storetest.S3Record(body, nil))
	st := storetest.S3Store(t, srv, "syncular/", func(cfg *s3.Options) { cfg.Timeout = 500 * time.Millisecond })
	ctx := context.Background()

	read := func(rc io.ReadCloser, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	whole := read(st.Open(ctx, idOf(id), 0, -1))
	if sum := sha256.Sum256(whole); "sha256:"+hex.EncodeToString(sum[:]) != id {
		t.Fatal("whole object does not hash to its id")
	}
	n := int64(len(body))
	for _, c := range []struct{ off, n int64 }{{0, 1}, {5, 10}, {n - 3, 3}, {n - 3, -1}, {1 << 20, 1 << 20}, {7, n}, {0, 0}} {
		got := read(st.Open(ctx, idOf(id), c.off, c.n))
		end := n
		if c.n >= 0 && c.off+c.n < n {
			end = c.off + c.n
		}
		if !bytes.Equal(got, body[c.off:end]) {
			t.Errorf("Open(%d, %d): %d bytes, want body[%d:%d]", c.off, c.n, len(got), c.off, end)
		}
	}
	// Past the end: empty, as every store (the Store.Open contract; the
	// store's own 416 is OpenRange's).
	if got := read(st.Open(ctx, idOf(id), n+10, -1)); len(got) != 0 {
		t.Errorf("Open past the end: %d bytes", len(got))
	}

	t.Run("OpenRange", func(t *testing.T) {
		obj, err := st.OpenRange(ctx, idOf(id), "bytes=10-19")
		if err != nil {
			t.Fatal(err)
		}
		got := read(obj.Body, nil)
		if obj.StatusCode != 206 || obj.ContentLength != 10 || obj.Size != n ||
			obj.ContentRange != "bytes 10-19/"+itoa(n) || !bytes.Equal(got, body[10:20]) {
			t.Errorf("206: %+v", obj)
		}
		obj, err = st.OpenRange(ctx, idOf(id), "bytes=-5")
		if err != nil {
			t.Fatal(err)
		}
		if got := read(obj.Body, nil); obj.StatusCode != 206 || !bytes.Equal(got, body[n-5:]) {
			t.Errorf("suffix: %+v", obj)
		}
		obj, err = st.OpenRange(ctx, idOf(id), "")
		if err != nil {
			t.Fatal(err)
		}
		if got := read(obj.Body, nil); obj.StatusCode != 200 || obj.ContentLength != n || obj.Size != n || obj.ContentRange != "" || !bytes.Equal(got, body) {
			t.Errorf("200: %+v", obj)
		}
		_, err = st.OpenRange(ctx, idOf(id), "bytes="+itoa(n)+"-")
		var re *store.RangeNotSatisfiableError
		if !errors.Is(err, store.ErrRangeNotSatisfiable) || !errors.As(err, &re) || errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unsatisfiable: %v", err)
		}
		t.Logf("416: %v (size %d)", err, re.Size)
	})

	t.Run("body outlives the header timeout", func(t *testing.T) {
		rc, err := st.Open(ctx, idOf(id), 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * 500 * time.Millisecond)
		if got := read(rc, nil); !bytes.Equal(got, body) {
			t.Errorf("read %d bytes after the timeout", len(got))
		}
	})

	t.Run("caller cancel stops the body", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		rc, err := st.Open(cctx, idOf(id), 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		cancel()
		if _, err := io.ReadAll(rc); err == nil {
			t.Error("read the whole body after the caller canceled")
		}
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestS3NewValidation(t *testing.T) {
	ctx := context.Background()
	bad := map[string]s3.Options{
		"no bucket":          {Region: "auto", AccessKeyID: "a", SecretAccessKey: "b"},
		"key without secret": {Bucket: "b", Region: "auto", AccessKeyID: "a"},
		"secret without key": {Bucket: "b", Region: "auto", SecretAccessKey: "SECRET-VALUE"},
		"token without key":  {Bucket: "b", Region: "auto", SessionToken: "TOKEN-VALUE"},
		"bad endpoint":       {Bucket: "b", Region: "auto", Endpoint: "ftp://x", AccessKeyID: "a", SecretAccessKey: "SECRET-VALUE"},
		"endpoint with user": {Bucket: "b", Region: "auto", Endpoint: "https://u:SECRET-VALUE@x", AccessKeyID: "a", SecretAccessKey: "b"},
	}
	for name, cfg := range bad {
		t.Run(name, func(t *testing.T) {
			st, err := s3.New(ctx, cfg)
			if err == nil {
				st.Close()
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), "SECRET-VALUE") || strings.Contains(err.Error(), "TOKEN-VALUE") {
				t.Errorf("error leaks a secret: %v", err)
			}
		})
	}
	st, err := s3.New(ctx, s3.Options{Bucket: "b", Region: "auto", Endpoint: "https://acct.r2.cloudflarestorage.com/", AccessKeyID: "a", SecretAccessKey: "b", PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if k := st.ObjectKey(idOf("sha256:" + strings.Repeat("0", 64))); k != "seg/sha256/"+strings.Repeat("0", 64) {
		t.Errorf("ObjectKey %s", k)
	}
	if st.Client().Options().Region != "auto" || !st.Client().Options().UsePathStyle {
		t.Errorf("client options %+v", st.Client().Options())
	}
}

// s3HermeticChain points the SDK's default chain away from this machine's
// files and instance metadata.
func s3HermeticChain(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_DEFAULT_PROFILE": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": "",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_ROLE_ARN": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": "",
	} {
		t.Setenv(k, v)
	}
}

// TestS3StoreDefaultChainEnv: no keys in the config, the environment
// provides credentials and region.
func TestS3StoreDefaultChainEnv(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	body := []byte("read with credentials from the environment")
	id := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "", body, storetest.S3Record(body, nil))
	s3HermeticChain(t)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_REGION", srv.Region)
	st := storetest.S3Store(t, srv, "", func(cfg *s3.Options) {
		cfg.AccessKeyID, cfg.SecretAccessKey, cfg.Region = "", "", ""
	})
	if _, err := st.Lookup(context.Background(), idOf(id)); err != nil {
		t.Fatal(err)
	}

	// An empty chain is a fault, reported at the first request.
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	none := storetest.S3Store(t, srv, "", func(cfg *s3.Options) { cfg.AccessKeyID, cfg.SecretAccessKey = "", "" })
	start := time.Now()
	_, err := none.Lookup(context.Background(), idOf(id))
	s3AssertFault(t, err, srv.SecretKey)
	if !strings.Contains(err.Error(), "no usable credentials") || time.Since(start) > 3*time.Second {
		t.Errorf("no credentials: %v after %v", err, time.Since(start))
	}
}

// TestS3StoreDefaultChainRefresh: credentials from a container-credentials
// endpoint (loopback) are refreshed when they expire, and the store follows
// them: a rotation to a bad secret shows up as faults, the rotation back
// heals it, without rebuilding the store.
func TestS3StoreDefaultChainRefresh(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	body := []byte("read with refreshed credentials")
	id := s3test.PutSegment(t, srv.Client(), storetest.S3Bucket, "", body, storetest.S3Record(body, nil))

	var (
		mu           sync.Mutex
		akid, secret = srv.AccessKey, srv.SecretKey
		fetches      int
	)
	// The SDK refreshes container credentials 5 min before they expire:
	// these are good for 1.5 s of cache.
	const cacheFor = 1500 * time.Millisecond
	credSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fetches++
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{
			"AccessKeyId":     akid,
			"SecretAccessKey": secret,
			"Expiration":      time.Now().Add(5*time.Minute + cacheFor).UTC().Format(time.RFC3339Nano),
		})
	}))
	defer credSrv.Close()
	s3HermeticChain(t)
	t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", credSrv.URL+"/creds")
	st := storetest.S3Store(t, srv, "", func(cfg *s3.Options) { cfg.AccessKeyID, cfg.SecretAccessKey = "", "" })
	ctx := context.Background()
	lookup := func() error { _, err := st.Lookup(ctx, idOf(id)); return err }
	count := func() int { mu.Lock(); defer mu.Unlock(); return fetches }
	// Rotations change the key id too, as real ones do: the SDK caches the
	// derived signing key per key id and day, so a new secret under the
	// same key id would not be used before the next day.
	rotate := func(a, s string) { mu.Lock(); akid, secret = a, s; mu.Unlock() }

	for i := 0; i < 3; i++ {
		if err := lookup(); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("%d credential fetches for 3 lookups within the cache life", n)
	}
	rotate("ROTATEDKEYID", "rotated-to-a-wrong-secret")
	if err := lookup(); err != nil {
		t.Fatalf("cached credentials should still be used: %v", err)
	}
	time.Sleep(cacheFor + 300*time.Millisecond)
	// versitygw answers an unknown key id with 404 (XAdminUserNotFound),
	// which a body-less HEAD cannot tell from a missing object: the GET
	// shows the code.
	_, err := st.Open(ctx, idOf(id), 0, -1)
	s3AssertFault(t, err, "rotated-to-a-wrong-secret", srv.SecretKey)
	if n := count(); n != 2 {
		t.Errorf("%d credential fetches after expiry, want 2", n)
	}
	rotate(srv.AccessKey, srv.SecretKey)
	time.Sleep(cacheFor + 300*time.Millisecond)
	if err := lookup(); err != nil {
		t.Fatalf("after rotating back: %v", err)
	}
}

// ---- fuzz and benchmarks ----------------------------------------------

func FuzzDecodeS3Record(f *testing.F) {
	v := s3LoadVectors(f)
	for _, p := range v.Puts {
		var m struct {
			SegmentID string `json:"segmentId"`
		}
		_ = json.Unmarshal([]byte(p.RecordHeaderDecodedJSON), &m)
		f.Add(p.RecordHeaderValue, m.SegmentID)
	}
	h, id := s3Rec(f, func(m map[string]any) {
		m["scopeDigests"] = []any{"x", "y"}
		m["publications"] = []any{s3Pub(m, "p2", "z", 9)}
	})
	f.Add(h, id)
	h, _ = s3Rec(f, func(m map[string]any) { m["publications"] = []any{} })
	f.Add(h, id)
	f.Add("", id)
	f.Add("e30", id) // {}
	f.Fuzz(func(t *testing.T, header, id string) {
		rec, err := s3.DecodeRecord(header, id)
		if err != nil {
			if rec != nil || !errors.Is(err, store.ErrCorruptRecord) {
				t.Fatalf("error %v with record %v", err, rec)
			}
			return
		}
		if rec.SegmentID != id || !segid.Valid(id) || rec.ByteLength < 0 || rec.Fenced || rec.LegacyHeader {
			t.Fatalf("bad record %+v for %q", rec, id)
		}
		// The record object layout reads the same JSON the same way.
		raw, ok := s3DecodeLoose(header)
		if !ok {
			t.Fatalf("header decoded, but not as base64: %q", header)
		}
		obj, err := s3.DecodeRecordObject(raw, id)
		if err != nil || !reflect.DeepEqual(obj, rec) {
			t.Fatalf("record object decoder disagrees: %+v, %v; header gave %+v", obj, err, rec)
		}
		// No publication only from an explicit empty list (§4).
		if len(rec.Publications) == 0 {
			var m map[string]json.RawMessage
			if json.Unmarshal(raw, &m) != nil || strings.Join(strings.Fields(string(m["publications"])), "") != "[]" {
				t.Fatalf("no publications without an explicit empty list: %s", raw)
			}
		}
		for _, p := range rec.Publications {
			if p.ByteLength != rec.ByteLength || (p.MediaType != store.MediaRows && p.MediaType != store.MediaSQLite) {
				t.Fatalf("bad publication %+v", p)
			}
		}
	})
}

// s3DecodeLoose decodes a header value the ways DecodeRecord accepts:
// base64url or standard, padded or not, ASCII whitespace ignored.
func s3DecodeLoose(h string) ([]byte, bool) {
	h = strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\n', '\f', '\r':
			return -1
		case '+':
			return '-'
		case '/':
			return '_'
		}
		return r
	}, h)
	h = strings.TrimRight(h, "=")
	b, err := base64.RawURLEncoding.DecodeString(h)
	return b, err == nil
}

func BenchmarkDecodeS3Record(b *testing.B) {
	v := s3LoadVectors(b)
	p := v.Puts[0]
	var m struct {
		SegmentID string `json:"segmentId"`
	}
	_ = json.Unmarshal([]byte(p.RecordHeaderDecodedJSON), &m)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s3.DecodeRecord(p.RecordHeaderValue, m.SegmentID); err != nil {
			b.Fatal(err)
		}
	}
}

// ---- record layouts (protocol §5.2) ----------------------------------

// TestS3StoreRecordLayouts writes objects into versitygw in each layout
// the reference writers produce and checks what Lookup makes of them,
// with the requests each lookup cost.
func TestS3StoreRecordLayouts(t *testing.T) {
	const now = int64(1750000000000)
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	c := srv.Client()
	const prefix = "syncular/"
	st := storetest.S3Store(t, srv, prefix, nil)
	ctx := context.Background()

	// lookup runs one cold Lookup and checks it cost exactly the record
	// object GET and the bytes HEAD.
	lookup := func(t *testing.T, id string) (*store.Record, error) {
		t.Helper()
		before := srv.Requests(t)
		rec, err := st.Lookup(ctx, idOf(id))
		after := srv.Requests(t)
		made := after[len(before):]
		ops := map[string]int{}
		for _, r := range made {
			ops[r.Operation+" "+r.Key]++
		}
		want := map[string]int{
			"s3_GetObject " + st.RecordKey(idOf(id)):  1,
			"s3_HeadObject " + st.ObjectKey(idOf(id)): 1,
		}
		if !reflect.DeepEqual(ops, want) {
			t.Errorf("Lookup made requests %v, want %v", ops, want)
		}
		return rec, err
	}
	grant := func(rec *store.Record, part, sd string) store.Outcome {
		out := store.Grant(rec, sd, s3Audience(part), s3Audience, now).Outcome
		return out
	}

	t.Run("record object only", func(t *testing.T) {
		body := []byte("written by a current writer")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, "")
		s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, storetest.S3RecordMap(body, nil))
		rec, err := lookup(t, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.LegacyHeader || rec.ByteLength != int64(len(body)) || len(rec.Publications) != 1 {
			t.Errorf("record %+v", rec)
		}
		if out := grant(rec, "p1", "d1"); out != store.Granted {
			t.Errorf("Grant = %v", out)
		}
	})
	t.Run("header only", func(t *testing.T) {
		body := []byte("written by an older writer")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, s3test.RecordHeader(storetest.S3RecordMap(body, nil)))
		rec, err := lookup(t, id)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.LegacyHeader || len(rec.Publications) != 1 {
			t.Errorf("record %+v", rec)
		}
		if out := grant(rec, "p1", "d1"); out != store.Granted {
			t.Errorf("Grant = %v", out)
		}
	})
	t.Run("both: the record object rules", func(t *testing.T) {
		body := []byte("old bytes object, republished since")
		// The stale header grants p1/d-old only; the record object grants
		// p2/d-new only.
		header := storetest.S3RecordMap(body, func(m map[string]any) { m["scopeDigest"] = "d-old" })
		object := storetest.S3RecordMap(body, func(m map[string]any) {
			m["publications"] = []any{s3Pub(m, "p2", "d-new", now+60_000)}
		})
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, s3test.RecordHeader(header))
		s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, object)
		rec, err := lookup(t, id)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.LegacyHeader {
			t.Error("LegacyHeader false for an object carrying the header")
		}
		if out := grant(rec, "p2", "d-new"); out != store.Granted {
			t.Errorf("grant only the record object has: %v, want Granted", out)
		}
		if out := grant(rec, "p1", "d-old"); out != store.Forbidden {
			t.Errorf("grant only the stale header has: %v, want Forbidden", out)
		}
		// Once the record object is gone, the header is the record again:
		// the test above can fail.
		s3test.DeleteRecordObject(t, c, storetest.S3Bucket, prefix, id)
		rec, err = lookup(t, id)
		if err != nil {
			t.Fatal(err)
		}
		if grant(rec, "p1", "d-old") != store.Granted || grant(rec, "p2", "d-new") != store.Forbidden {
			t.Errorf("header record %+v", rec.Publications)
		}
	})
	t.Run("neither", func(t *testing.T) {
		body := []byte("bytes whose record is gone")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, "")
		if rec, err := lookup(t, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Lookup = %+v, %v; want ErrNotFound", rec, err)
		}
	})
	t.Run("record object without bytes", func(t *testing.T) {
		body := []byte("bytes deleted by a lifecycle rule")
		id := s3test.SegmentID(body)
		s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, storetest.S3RecordMap(body, nil))
		if rec, err := st.Lookup(ctx, idOf(id)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Lookup = %+v, %v; want ErrNotFound", rec, err)
		}
	})
	t.Run("empty publications list", func(t *testing.T) {
		body := []byte("published, then every publication withdrawn")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, "")
		s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, storetest.S3RecordMap(body, func(m map[string]any) {
			m["expiresAtMs"] = now + 60_000
			m["publications"] = []any{}
		}))
		rec, err := lookup(t, id)
		if err != nil {
			t.Fatal(err)
		}
		if out := grant(rec, "p1", "d1"); out != store.Forbidden {
			t.Errorf("Grant = %v, want Forbidden", out)
		}
	})

	corrupt := map[string]struct {
		object any
		header bool // a valid header beside it must not be used
	}{
		"not json":             {object: "not json", header: true},
		"json array":           {object: "[1]", header: true},
		"base64 of the record": {object: s3test.RecordHeader(storetest.S3RecordMap([]byte("x"), nil)), header: true},
		"another segment":      {object: storetest.S3RecordMap([]byte("elsewhere"), nil)},
		"missing field":        {object: storetest.S3RecordMap(nil, func(m map[string]any) { delete(m, "table") }), header: true},
		"length differs":       {object: storetest.S3RecordMap(nil, func(m map[string]any) { m["byteLength"] = 3 })},
	}
	for name, tc := range corrupt {
		t.Run("corrupt record object/"+name, func(t *testing.T) {
			body := []byte("a segment whose record object is corrupt: " + name)
			hdr := ""
			if tc.header {
				hdr = s3test.RecordHeader(storetest.S3RecordMap(body, nil))
			}
			id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, hdr)
			obj := tc.object
			if m, ok := obj.(map[string]any); ok {
				// Records built for a nil body: make them name this one,
				// unless the case is about the segment id.
				if name != "another segment" {
					m["segmentId"] = id
				}
				if name != "length differs" {
					m["byteLength"] = len(body)
				}
			}
			s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, obj)
			rec, err := lookup(t, id)
			s3AssertFault(t, err)
			if !errors.Is(err, store.ErrCorruptRecord) {
				t.Errorf("Lookup = %+v, %v; want ErrCorruptRecord", rec, err)
			}
		})
	}
	t.Run("oversized record object", func(t *testing.T) {
		body := []byte("a segment with a huge record object")
		id := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, body, "")
		m := storetest.S3RecordMap(body, nil)
		m["pad"] = strings.Repeat("x", 1<<20)
		s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, id, m)
		_, err := st.Lookup(ctx, idOf(id))
		if !errors.Is(err, store.ErrCorruptRecord) {
			t.Errorf("want ErrCorruptRecord: %v", err)
		}
	})
}

// TestS3StoreCachedRequests: through store.Cached a cold lookup costs the
// two requests, a cached one none, and concurrent cold lookups of one
// segment share one flight (two requests in all).
func TestS3StoreCachedRequests(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	c := srv.Client()
	st := storetest.S3Store(t, srv, "", nil)
	ctx := context.Background()
	opts := store.DefaultCacheOptions()
	opts.RecordTTL = time.Hour
	cached := store.NewCached(st, opts)

	body := []byte("looked up through the cache")
	id := s3test.PutSegment(t, c, storetest.S3Bucket, "", body, s3test.RecordHeader(storetest.S3RecordMap(body, func(m map[string]any) { m["scopeDigest"] = "stale" })))
	s3test.PutRecordObject(t, c, storetest.S3Bucket, "", id, storetest.S3RecordMap(body, nil))

	n0 := srv.CountRequests(t, "", "")
	rec, err := cached.Lookup(ctx, idOf(id))
	if err != nil {
		t.Fatal(err)
	}
	cold := srv.CountRequests(t, "", "") - n0
	for range 5 {
		again, err := cached.Lookup(ctx, idOf(id))
		if err != nil || again != rec {
			t.Fatalf("cached Lookup = %p, %v", again, err)
		}
	}
	warm := srv.CountRequests(t, "", "") - n0 - cold
	t.Logf("cold lookup: %d requests; 5 cached lookups: %d requests", cold, warm)
	if cold != 2 || warm != 0 {
		t.Errorf("requests: cold %d (want 2), cached %d (want 0)", cold, warm)
	}
	if rec.Publications[0].ScopeDigest != "d1" || !rec.LegacyHeader {
		t.Errorf("record %+v", rec)
	}

	// Concurrent cold lookups of another segment: one flight.
	body2 := []byte("looked up by many at once")
	id2 := s3test.PutSegment(t, c, storetest.S3Bucket, "", body2, "")
	s3test.PutRecordObject(t, c, storetest.S3Bucket, "", id2, storetest.S3RecordMap(body2, nil))
	cached2 := store.NewCached(st, opts)
	n1 := srv.CountRequests(t, "", "")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := cached2.Lookup(ctx, idOf(id2))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	burst := srv.CountRequests(t, "", "") - n1
	t.Logf("16 concurrent cold lookups: %d requests", burst)
	// Goroutines that start after the flight ended hit the cache, so the
	// count is exactly one flight's two requests.
	if burst != 2 {
		t.Errorf("16 concurrent cold lookups made %d requests, want 2", burst)
	}
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
