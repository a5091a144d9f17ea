package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/internal/termsafe"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store/s3"
	"github.com/syncular/caddy-syncular/store/sqlite"
	"github.com/syncular/caddy-syncular/token"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "syncular-store",
		Usage: "inspect --config <file> [flags] [<segment id> [--token ST | --url SIGNED_URL]]",
		Short: "Shows what a syncular_segments edge sees in its segment store",
		Long: `Reads the segment store of a config's syncular_segments handler, read-only,
and prints what the edge sees: the backend, the layout it detects (SQLite:
schema generation, partition registry, backfill checkpoints, row counts;
S3: bucket and prefix), and for a segment id its publications with their
state (live, expired, fenced by the partition registry, overtaken by a
backfill checkpoint). With --token or --url it also prints the decision the
handler takes for that signed request, and why: the handler is provisioned
from the config and answers a HEAD request, so the answer comes from its
own code.

This is an operator's tool reading the operator's own store: it prints
partition ids and scope digests. It never prints a key, a token, an
audience or S3 credentials (a redirect's presigned URL is shown without
its query). Secrets come from the environment as caddy run reads them.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(storeInspectCommand())
		},
	})
}

func storeInspectCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "inspect --config <Caddyfile|json> [--adapter caddyfile] [--site <host or index>] [<segment id> [--token ST | --url SIGNED_URL]] [--timeout 10s] [--now T]",
		Short: "Prints the store's layout, a segment's publications, and the handler's decision for a token",
		Long: `Prints the store's layout and counts. With a segment id, its objects (S3)
and its publications with their state at --now; partition ids are printed
(this reads your own store). With --token (or --url, a whole signed URL,
whose segment id is then the default) the decision the provisioned handler
takes for a HEAD of that URL: status, error code and reason, or the
delivery. Exits 1 when that decision is a refusal. The whole run is
bounded by --timeout.

--site picks the handler when the config has several: a host of its site
block, or its index as listed (0 first). Without it the first is used.`,
		Args: cobra.MaximumNArgs(1),
		RunE: runStoreInspect,
	}
	f := c.Flags()
	f.String("config", "", "config file (Caddyfile or JSON); secrets from the environment as caddy run reads them")
	f.String("adapter", "caddyfile", "adapter of --config (\"json\" for JSON)")
	f.String("site", "", "which syncular_segments handler: a host of its site, or its index (0 first)")
	f.String("token", "", "a segment token (st) to decide for the segment id, or env:NAME to read it from a variable")
	f.String("url", "", "a signed segment URL to decide for (its segment id is the default)")
	f.Duration("timeout", 10*time.Second, "bound on the whole inspection")
	f.String("now", "", "time of the check, RFC 3339 or unix ms (default: now)")
	c.SilenceUsage = true
	return c
}

// storeInspection is one run of `syncular-store inspect`.
type storeInspection struct {
	where  configHandler
	index  int
	count  int
	segID  string
	id     segid.ID // segID, parsed
	token  string   // the st, never printed
	target string   // request target of the HEAD, with the st
	now    time.Time

	// The publications the token's scope digest and audience match, as
	// "[i] state", from describeSegment; nil when not decoded.
	matched []string
}

// runStoreInspect prints through termsafe: what the store holds (partition
// ids, table names, digests, media types, a service's error text) may
// have been written by anyone who could write the store, and reaches the
// terminal escaped.
func runStoreInspect(cmd *cobra.Command, args []string) error {
	return safeErr(storeInspect(cmd, args))
}

func storeInspect(cmd *cobra.Command, args []string) error {
	f := cmd.Flags()
	get := func(name string) string { v, _ := f.GetString(name); return v }
	path := get("config")
	if path == "" {
		return errors.New("--config is required (the config whose syncular_segments handler to inspect)")
	}
	in := storeInspection{now: time.Now()}
	if s := get("now"); s != "" {
		t, err := token.ParseTime(s)
		if err != nil {
			return fmt.Errorf("--now: %w", err)
		}
		in.now = t
	}
	if len(args) == 1 {
		in.segID = args[0]
	}
	if err := in.request(get("token"), get("url")); err != nil {
		return err
	}
	cfg, err := loadConfig(path, get("adapter"))
	if err != nil {
		return err
	}
	found := findHandlers(cfg)
	if len(found) == 0 {
		return fmt.Errorf("--config: %s has no syncular_segments handler", path)
	}
	if in.index, err = pickHandler(found, get("site")); err != nil {
		return err
	}
	in.where, in.count = found[in.index], len(found)

	timeout, _ := f.GetDuration("timeout")
	if timeout <= 0 {
		return errors.New("--timeout must be positive")
	}
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	out := &lockedWriter{w: termsafe.Writer{W: cmd.OutOrStdout()}}
	done := make(chan error, 1)
	go func() { done <- in.run(ctx, out) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		out.close()
		return fmt.Errorf("inspection did not finish within --timeout %v", timeout)
	}
}

// request sets the segment id and the HEAD's target from --token or
// --url.
func (in *storeInspection) request(tok, rawURL string) error {
	switch {
	case tok != "" && rawURL != "":
		return errors.New("give --token or --url, not both")
	case rawURL != "":
		u, err := url.Parse(rawURL)
		if err != nil {
			return errors.New("--url: not a URL")
		}
		t, urlSeg, err := token.TokenFromURL(rawURL)
		if err != nil {
			return fmt.Errorf("--url: %w", err)
		}
		if in.segID == "" {
			in.segID = urlSeg
		} else if in.segID != urlSeg {
			return errors.New("the segment id given is not the one in --url")
		}
		// The target as sent: the raw text after scheme and host, so a
		// '#' the edge refuses is still there.
		in.token, in.target = t, rawURL
		if u.Scheme != "" || u.Host != "" {
			in.target = strings.TrimPrefix(rawURL, u.Scheme+"://"+u.Host)
		}
		if !strings.HasPrefix(in.target, "/") {
			return errors.New("--url: want a signed URL (https://host/…/segments/<id>?st=…) or its path")
		}
	case tok != "":
		// env:NAME keeps the token out of shell history and ps (a
		// token is base64url: it never holds a colon).
		if name, ok := strings.CutPrefix(tok, "env:"); ok {
			v, set := os.LookupEnv(name)
			if !set || v == "" {
				return fmt.Errorf("--token: environment variable %s is unset or empty", name)
			}
			tok = v
		}
		if in.segID == "" {
			return errors.New("--token needs the segment id it is for")
		}
		in.token = tok
		in.target = "/segments/" + url.PathEscape(in.segID) + "?st=" + url.QueryEscape(tok)
	}
	if in.segID != "" {
		id, err := segid.ParseID(in.segID)
		if err != nil {
			return errors.New("the segment id must be sha256: followed by 64 lowercase hex digits")
		}
		in.id = id
	}
	return nil
}

// pickHandler is the index of the handler --site names (a host of its
// site, or an index), or 0.
func pickHandler(found []configHandler, site string) (int, error) {
	if site == "" {
		return 0, nil
	}
	if i, err := strconv.Atoi(site); err == nil {
		if i < 0 || i >= len(found) {
			return 0, fmt.Errorf("--site %d: the config has %d syncular_segments handler(s)%s", i, len(found), listHandlers(found))
		}
		return i, nil
	}
	for i, h := range found {
		for _, host := range h.hosts {
			if strings.EqualFold(host, site) {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("--site %s: no syncular_segments handler in a site of that host%s", site, listHandlers(found))
}

func listHandlers(found []configHandler) string {
	var b strings.Builder
	b.WriteString(":")
	for i, h := range found {
		fmt.Fprintf(&b, "\n  %d: %s", i, h.site())
	}
	return b.String()
}

// run provisions the handler and prints the inspection.
func (in *storeInspection) run(ctx context.Context, w io.Writer) error {
	h := new(Handler)
	if err := json.Unmarshal(in.where.raw, h); err != nil {
		return fmt.Errorf("syncular_segments: %w", err)
	}
	// Nothing registered globally, and the clock of --now.
	h.DisableMetrics = true
	h.inspecting = true
	now := in.now
	h.now = func() time.Time { return now }

	fmt.Fprintf(w, "handler     #%d of %d: %s\n", in.index, in.count, in.where.site())
	if in.count > 1 {
		fmt.Fprintf(w, "            (--site <host or index> picks another)\n")
	}
	cctx, ccancel := caddy.NewContext(caddy.Context{Context: ctx})
	defer ccancel()
	err := h.Provision(cctx)
	if err == nil {
		err = h.Validate()
	}
	defer h.Cleanup()
	if err != nil {
		fmt.Fprintf(w, "provision   failed: the edge would refuse this config\n")
		return err
	}
	// The request path's warnings (a store fault) are in the output.
	h.logger = zap.NewNop()
	fmt.Fprintf(w, "delivery    %s (untokened requests: %s)\n", h.Delivery, h.Untokened)
	fmt.Fprintf(w, "tokens      %d key(s), audience %s, skew %v\n", len(h.Keys), h.Audience.Kind, h.skew)

	switch st := h.backend.(type) {
	case *sqlite.Store:
		describeSQLite(ctx, w, st)
	case *s3.Store:
		describeS3(ctx, w, st, in.segID)
	default:
		fmt.Fprintf(w, "backend     %T\n", h.backend)
	}
	if in.segID == "" {
		return nil
	}
	in.describeSegment(ctx, w, h, h.backend)
	if in.target == "" {
		return nil
	}
	return in.decide(ctx, w, h)
}

// lockedWriter lets the inspection write from its goroutine while the
// command may stop waiting (timeout): after close, writes are dropped.
type lockedWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	return l.w.Write(p)
}

func (l *lockedWriter) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}
