package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/syncular/caddy-syncular/internal/termsafe"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
	"github.com/syncular/caddy-syncular/token"
)

// This file prints the report of `caddy syncular-store inspect`
// (store_command.go reads the flags and the config and provisions the
// handler): the store's layout, a segment's publications, and the
// handler's own answer to a HEAD of the signed URL, printed as read,
// never re-decided.

func describeSQLite(ctx context.Context, w io.Writer, st *sqlite.Store) {
	d, err := st.Describe(ctx)
	if err != nil {
		fmt.Fprintf(w, "backend     sqlite\nlayout      unreadable: %v\n", err)
		return
	}
	fmt.Fprintf(w, "backend     sqlite %s (journal mode %s, schema_version %d)\n", d.Path, termsafe.Field(d.JournalMode), d.SchemaVersion)
	if d.JournalMode != sqlite.JournalWAL {
		fmt.Fprintf(w, "            warning: journal mode %s is a rollback journal: the edge's reads can make the sync server's\n"+
			"            writes fail with \"database is locked\"; fix: open it with PRAGMA journal_mode=WAL (persists in the file)\n", termsafe.Field(d.JournalMode))
	}
	var gen string
	switch d.Generation {
	case 1:
		gen = "1 (sync_segments without log_epoch)"
	case 2:
		gen = "2 (sync_segments with log_epoch)"
	default:
		gen = "3 (sync_segment_publications"
		if !d.PublicationsTable || !d.ScopesTable {
			gen = "3, partial (" + map[bool]string{true: "sync_segment_publications only", false: "sync_segment_scopes only"}[d.PublicationsTable]
		} else {
			gen += " and sync_segment_scopes"
		}
		gen += ")"
	}
	fmt.Fprintf(w, "layout      schema generation %s\n", gen)
	if d.Registry {
		fmt.Fprintf(w, "            partition registry present: epoch fencing on (%d partitions)\n", d.RegistryPartitions)
	} else {
		fmt.Fprintf(w, "            partition registry absent: no epoch fencing\n")
	}
	if d.Checkpoints {
		fmt.Fprintf(w, "            backfill checkpoints table present (%d rows)\n", d.CheckpointRows)
	} else {
		fmt.Fprintf(w, "            backfill checkpoints table absent: nothing is overtaken\n")
	}
	fmt.Fprintf(w, "counts      %d segments", d.Segments)
	if d.Publications >= 0 {
		fmt.Fprintf(w, ", %d publication rows", d.Publications)
	}
	fmt.Fprintln(w)
}

func describeS3(ctx context.Context, w io.Writer, st *s3.Store, segID string) {
	d, err := st.Describe(ctx, segID)
	fmt.Fprintf(w, "backend     s3 bucket %q prefix %q\n", st.Bucket(), st.Prefix())
	if err != nil {
		fmt.Fprintf(w, "objects     unreadable: %v\n", err)
		return
	}
	if segID == "" {
		fmt.Fprintf(w, "layout      per segment: give a segment id (a bucket is not listed)\n")
		return
	}
	bytesObj := "absent"
	if d.BytesObject {
		bytesObj = fmt.Sprintf("present, %d bytes", d.BytesLength)
		if d.LegacyHeader {
			bytesObj += ", carries x-amz-meta-syncular-record"
		} else {
			bytesObj += ", no x-amz-meta-syncular-record header"
		}
	}
	recObj := "absent"
	if d.RecordObject {
		recObj = fmt.Sprintf("present, %d bytes", d.RecordLength)
	}
	fmt.Fprintf(w, "objects     %s: %s\n", d.ObjectKey, bytesObj)
	fmt.Fprintf(w, "            %s: %s\n", d.RecordKey, recObj)
	fmt.Fprintf(w, "layout      %s\n", d.Layout())
}

// describeSegment prints the segment's record and the state of each
// publication, read from the store itself (not the handler's cache).
func (in *storeInspection) describeSegment(ctx context.Context, w io.Writer, h *Handler, st store.Store) {
	fmt.Fprintf(w, "\nsegment     %s\n", in.segID)
	lctx, cancel := h.storeContext(ctx)
	rec, err := st.Lookup(lctx, in.id)
	cancel()
	switch {
	case errors.Is(err, store.ErrNotFound):
		fmt.Fprintf(w, "record      none: the edge answers sync.not_found\n")
		return
	case err != nil:
		fmt.Fprintf(w, "record      unreadable (the edge answers 503/504): %v\n", err)
		return
	}
	nowMs := in.now.UnixMilli()
	fmt.Fprintf(w, "record      %d bytes, %s, %d publication(s) at %s\n", rec.ByteLength, termsafe.Field(rec.MediaType), len(rec.Publications), in.now.UTC().Format(time.RFC3339))
	var claims *token.Report
	if in.token != "" {
		claims = token.Inspect(in.token, token.InspectOptions{SegmentID: in.segID, Now: in.now, Skew: h.skew, MaxLen: h.MaxTokenLength})
		if claims.Decoded {
			in.matched = []string{}
		}
	}
	for i, p := range store.PublicationStates(rec, nowMs) {
		// Store-derived strings: Field (or %q) escapes them.
		fmt.Fprintf(w, "  [%d] %-9s partition %s, epoch %q", i, p.State, termsafe.Field(p.Partition), p.LogEpoch)
		switch {
		case rec.Fenced && !p.Registered:
			fmt.Fprintf(w, " (partition not in the registry)")
		case rec.Fenced && p.CurrentEpoch != p.LogEpoch:
			fmt.Fprintf(w, " (registry: %q)", p.CurrentEpoch)
		}
		fmt.Fprintf(w, ", table %s v%d", termsafe.Field(p.Table), p.SchemaVersion)
		if p.HasCheckpoint {
			fmt.Fprintf(w, " (checkpoint v%d)", p.Checkpoint)
		}
		fmt.Fprintf(w, "\n      scope digest %s\n", termsafe.Field(p.ScopeDigest))
		fmt.Fprintf(w, "      created %s, expires %s\n", when(p.CreatedAtMs, nowMs), when(p.ExpiresAtMs, nowMs))
		if claims != nil && claims.Decoded {
			sd, aud := claims.SD == p.ScopeDigest, claims.Aud == h.audience.Derive(p.Partition)
			fmt.Fprintf(w, "      token: scope digest %s, audience %s\n", matchWord(sd), matchWord(aud))
			if sd && aud {
				in.matched = append(in.matched, fmt.Sprintf("[%d] %s", i, p.State))
			}
		}
	}
}

func matchWord(ok bool) string {
	if ok {
		return "matches"
	}
	return "differs"
}

// when is an epoch-ms time in RFC 3339 and relative to nowMs.
func when(ms, nowMs int64) string {
	t := time.UnixMilli(ms).UTC().Format(time.RFC3339)
	d := time.Duration(ms-nowMs) * time.Millisecond
	switch {
	case d == 0:
		return t + " (now)"
	case d > 0:
		return t + " (in " + roundRel(d).String() + ")"
	default:
		return t + " (" + roundRel(-d).String() + " ago)"
	}
}

func roundRel(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// decide has the provisioned handler answer a HEAD of the signed URL and
// prints its answer. The outcome and reason are the handler's own
// ({http.syncular.outcome}, {http.syncular.reason} and the JSON error
// body); nothing here re-decides. A refusal is returned as an error.
func (in *storeInspection) decide(ctx context.Context, w io.Writer, h *Handler) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "http://edge.invalid"+in.target, nil)
	if err != nil {
		return errors.New("the signed URL cannot be requested")
	}
	req.RequestURI = in.target
	repl := caddyhttp.NewTestReplacer(req)
	rr := httptest.NewRecorder()
	nextCalled := false
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		nextCalled = true
		return nil
	})
	if err := h.ServeHTTP(rr, req, next); err != nil {
		return fmt.Errorf("handler error: %w", err)
	}
	res := rr.Result()
	outcome, reason := replString(repl, "http.syncular.outcome"), replString(repl, "http.syncular.reason")
	fmt.Fprintf(w, "\ndecision    HEAD %s (the handler's own answer at %s)\n", redactTarget(in.target), in.now.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "  status    %d %s\n", res.StatusCode, http.StatusText(res.StatusCode))
	fmt.Fprintf(w, "  outcome   %s\n", outcome)
	if slot := replString(repl, "http.syncular.key_slot"); slot != "" {
		fmt.Fprintf(w, "  key slot  %s\n", slot)
	}
	if nextCalled {
		fmt.Fprintf(w, "  handed to the next handler (no st parameter)\n")
		return nil
	}
	if outcome != outcomeGranted && outcome != outcomeNotModified {
		var body struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(rr.Body.Bytes(), &body)
		fmt.Fprintf(w, "  error     %s: %s\n", body.Code, body.Message)
		switch {
		case in.matched == nil:
		case len(in.matched) == 0:
			fmt.Fprintf(w, "  matches   no publication has both the token's scope digest and audience\n")
		default:
			fmt.Fprintf(w, "  matches   %s (publications with the token's scope digest and audience)\n", strings.Join(in.matched, ", "))
		}
		if reason == "" {
			reason = body.Message
		}
		return fmt.Errorf("the edge would refuse this request: %s (%s)", body.Code, reason)
	}
	delivery := replString(repl, "http.syncular.delivery")
	fmt.Fprintf(w, "  delivery  %s\n", delivery)
	if loc := res.Header.Get("Location"); loc != "" {
		fmt.Fprintf(w, "  location  %s (presigned; query not shown)\n", withoutQuery(loc))
	}
	if l := res.Header.Get("Content-Length"); l != "" {
		fmt.Fprintf(w, "  length    %s bytes\n", l)
	}
	if cc := res.Header.Get("Cache-Control"); cc != "" {
		fmt.Fprintf(w, "  cache     %s\n", cc)
	}
	return nil
}

// redactTarget is the request target with its query (the token) and
// fragment replaced by an ellipsis.
func redactTarget(target string) string {
	if i := strings.IndexAny(target, "?#"); i >= 0 {
		return target[:i] + target[i:i+1] + "…"
	}
	return target
}

func withoutQuery(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable)"
	}
	p.RawQuery, p.Fragment, p.User = "", "", nil
	return p.String()
}
