package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/syncular/caddy-syncular/internal/termsafe"
	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/token"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "syncular-token",
		Usage: "mint|inspect [flags]",
		Short: "Mints and inspects Syncular signed segment tokens (st)",
		Long: `Mints a signed segment URL the way the sync server does, or decodes a
token (or a whole signed URL) and says whether this edge would accept it,
and if not, exactly why (bad MAC, expired by how much, segment mismatch,
scope or audience mismatch) and which key slot verified it.

Keys take the config's forms: hex:<hex>, base64:<b64>, plain UTF-8 text,
and env:NAME (or {env.NAME}) to read an environment variable. Prefer env:
so secrets stay out of shell history; the tool never prints a key. mint
refuses the keys the edge refuses (under 16 bytes, or all zero bytes);
inspect accepts any key, with a note when the edge would refuse it.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(mintCommand(), inspectCommand())
		},
	})
}

func mintCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "mint --key K --segment ID --scope-digest SD (--audience AUD | --partition P (--audience-template T | --audience-hmac-key K2 [--audience-encoding hex|base64url])) [--ttl 900s] [--base-url URL]",
		Short: "Prints a token (line 1) and its signed URL (line 2)",
		Args:  cobra.NoArgs,
		RunE:  runMint,
	}
	f := c.Flags()
	f.String("key", "", "signing key (hex:, base64:, env:NAME or text)")
	f.String("segment", "", "segment id (sha256:<64 hex>)")
	f.String("scope-digest", "", "scope digest (64 hex)")
	f.String("audience", "", "audience, as is")
	f.String("partition", "", "partition id, with --audience-template or --audience-hmac-key")
	f.String("audience-template", "", "audience template, {partition} replaced (e.g. aud:{partition})")
	f.String("audience-hmac-key", "", "audience HMAC-SHA256 key (hex:, base64:, env:NAME or text)")
	f.String("audience-encoding", "hex", "audience HMAC rendering: hex or base64url")
	f.Duration("ttl", token.DefaultTTLSeconds*time.Second, "token lifetime (whole seconds)")
	f.String("base-url", "http://127.0.0.1:8080/sync/segments", "URL of the segments route (the segment id is appended)")
	f.String("now", "", "issue time, RFC 3339 or unix ms (default: now)")
	c.SilenceUsage = true
	return c
}

func runMint(cmd *cobra.Command, _ []string) error {
	f := cmd.Flags()
	get := func(name string) string { v, _ := f.GetString(name); return v }
	// Mint refuses keys the edge refuses: a token minted with one could
	// never be verified by a provisioned edge.
	key, err := flagSecret("--key", get("key"))
	if err != nil {
		return err
	}
	if err := checkKeyStrength(key); err != nil {
		return fmt.Errorf("--key %w", err)
	}
	seg, sd := get("segment"), get("scope-digest")
	if !segid.Valid(seg) {
		return errors.New("--segment must be sha256: followed by 64 lowercase hex digits")
	}
	if sd == "" {
		return errors.New("--scope-digest is required")
	}
	aud, err := mintAudience(get("audience"), get("partition"), get("audience-template"), get("audience-hmac-key"), get("audience-encoding"))
	if err != nil {
		return err
	}
	ttl, _ := f.GetDuration("ttl")
	if ttl < time.Second {
		return errors.New("--ttl must be at least 1s")
	}
	now := time.Now()
	if s := get("now"); s != "" {
		if now, err = token.ParseTime(s); err != nil {
			return fmt.Errorf("--now: %w", err)
		}
	}
	u, expMs := token.IssueURL(key, strings.TrimSuffix(get("base-url"), "/"), seg, sd, aud, int64(ttl/time.Second), now.UnixMilli())
	_, tok, _ := strings.Cut(u, "?st=")
	fmt.Fprintln(cmd.OutOrStdout(), tok)
	fmt.Fprintln(cmd.OutOrStdout(), u)
	fmt.Fprintf(cmd.ErrOrStderr(), "expires %s (exp %d)\n", time.UnixMilli(expMs).UTC().Format(time.RFC3339), expMs/1000)
	return nil
}

// mintAudience is the audience given, or derived from a partition with
// the rule given (the edge's audience template / audience hmac_sha256).
func mintAudience(aud, partition, tmpl, hmacKey, encoding string) (string, error) {
	switch {
	case aud != "":
		if partition != "" || tmpl != "" || hmacKey != "" {
			return "", errors.New("give --audience, or --partition with an audience rule, not both")
		}
		return aud, nil
	case partition == "":
		return "", errors.New("an audience is required: --audience AUD, or --partition P with --audience-template T or --audience-hmac-key K")
	case (tmpl == "") == (hmacKey == ""):
		return "", errors.New("--partition needs exactly one of --audience-template and --audience-hmac-key")
	case tmpl != "":
		if !strings.Contains(tmpl, "{partition}") {
			return "", errors.New("--audience-template must contain {partition}")
		}
		return token.TemplateAudience(tmpl).Derive(partition), nil
	}
	k, err := flagSecret("--audience-hmac-key", hmacKey)
	if err != nil {
		return "", err
	}
	if err := checkKeyStrength(k); err != nil {
		return "", fmt.Errorf("--audience-hmac-key %w", err)
	}
	rule, err := token.HMACAudience(k, encoding)
	if err != nil {
		return "", fmt.Errorf("--audience-encoding: %w", err)
	}
	return rule.Derive(partition), nil
}

func inspectCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "inspect <token-or-URL> [--key K ... | --config Caddyfile [--partition P]] [--segment ID] [--scope-digest SD] [--audience AUD] [--now T] [--skew 60s]",
		Short: "Decodes a token and says whether the edge would accept it, and why not",
		Long: `Decodes a token or a signed URL and prints its claims. With --key (repeat
it for each configured key, current first, like the key subdirective) it
gives the edge's verdict: accept, or refuse with the reason the edge logs
(bad MAC, token expired and by how much, segment mismatch between the URL
and the claim, scope-digest or audience mismatch when --scope-digest or
--audience is given) and which key slot verified the MAC. With --config
the keys, skew and max_token_length come from the config's (first)
syncular_segments handler, secrets from the environment as caddy run
reads them, and --partition compares aud with the audience the config's
rule derives. Without a key the MAC is unchecked. Exits 1 when the token
would be refused.`,
		Args: cobra.ExactArgs(1),
		RunE: runInspect,
	}
	f := c.Flags()
	f.StringArray("key", nil, "verifying key, repeatable in slot order (hex:, base64:, env:NAME or text)")
	f.String("segment", "", "segment id the token is presented for (default: the URL's, else the token's own)")
	f.String("scope-digest", "", "compare the sd claim with this scope digest")
	f.String("audience", "", "compare the aud claim with this audience")
	f.String("now", "", "time of the check, RFC 3339 or unix ms (default: now)")
	f.Duration("skew", token.DefaultSkew, "clock skew allowed on exp (the edge's skew)")
	f.Int("max-token-length", token.DefaultMaxTokenLen, "the edge's max_token_length")
	f.String("config", "", "take keys, skew, max_token_length and the audience rule from this config's syncular_segments handler (secrets from the environment, as caddy run would)")
	f.String("adapter", "caddyfile", "adapter of --config (\"json\" for JSON)")
	f.String("partition", "", "with --config: compare aud with the audience the config derives for this partition")
	c.SilenceUsage = true
	return c
}

// runInspect prints through termsafe: the token's claims and the URL are
// the sender's, and reach the terminal escaped (errors too).
func runInspect(cmd *cobra.Command, args []string) error {
	return safeErr(inspectTo(cmd, termsafe.Writer{W: cmd.OutOrStdout()}, termsafe.Writer{W: cmd.ErrOrStderr()}, args[0]))
}

func inspectTo(cmd *cobra.Command, stdout, stderr io.Writer, arg string) error {
	f := cmd.Flags()
	get := func(name string) string { v, _ := f.GetString(name); return v }
	// The edge refuses a raw '#' with an st before or after it, before
	// looking at the token (hashHidesToken); so does the tool, by the
	// same rule.
	if hashHidesTokenIn(strings.TrimSpace(arg)) {
		fmt.Fprintf(stdout, "url:       holds a raw '#' and an st parameter: the edge answers 403 sync.forbidden before reading the token "+
			"(a log filter reading the URL would end it at the '#' and keep the token); sign and send the URL without a fragment\n")
		fmt.Fprintf(stdout, "verdict:   refuse: %s\n", reasonHashInURL)
		return fmt.Errorf("the edge would refuse this URL: %s", reasonHashInURL)
	}
	tok, urlSeg, err := token.TokenFromURL(arg)
	if err != nil {
		return err
	}
	opts := token.InspectOptions{SegmentID: urlSeg, ScopeDigest: get("scope-digest"), Audience: get("audience")}
	if s := get("segment"); s != "" {
		opts.SegmentID = s
	}
	rawKeys, _ := f.GetStringArray("key")
	for i, k := range rawKeys {
		kb, err := flagSecret(fmt.Sprintf("--key %d", i+1), k)
		if err != nil {
			return err
		}
		// Inspect diagnoses any key (it grants nothing), but says when
		// the edge would refuse to start with it.
		if err := checkKeyStrength(kb); err != nil {
			fmt.Fprintf(stderr, "note: --key %d %v; the edge refuses such a key at provision\n", i+1, err)
		}
		opts.Keys = append(opts.Keys, kb)
	}
	if s := get("now"); s != "" {
		if opts.Now, err = token.ParseTime(s); err != nil {
			return fmt.Errorf("--now: %w", err)
		}
	}
	opts.Skew, _ = f.GetDuration("skew")
	opts.MaxLen, _ = f.GetInt("max-token-length")
	if path := get("config"); path != "" {
		if err := optionsFromConfig(&opts, path, get("adapter"), get("partition"), f.Changed("skew"), f.Changed("max-token-length")); err != nil {
			return err
		}
	} else if get("partition") != "" {
		return errors.New("--partition needs --config (the audience rule comes from the config)")
	}
	r := token.Inspect(tok, opts)
	fmt.Fprint(stdout, r.String())
	if r.Verdict == token.VerdictRefuse {
		return fmt.Errorf("the edge would refuse this token: segment token rejected: %s", r.Reason)
	}
	return nil
}

// safeErr is err with its text escaped for the terminal (termsafe.Text):
// errors may quote a URL, a claim or a store's message.
func safeErr(err error) error {
	if err == nil {
		return nil
	}
	if msg := termsafe.Text(err.Error(), false); msg != err.Error() {
		return errors.New(msg)
	}
	return err
}

// optionsFromConfig fills the keys (when no --key was given), skew and
// max_token_length (unless given as flags) and, with a partition, the
// audience from the first syncular_segments handler of a config. Secrets
// are expanded from the environment as at provision; errors never show
// them.
func optionsFromConfig(opts *token.InspectOptions, path, adapterName, partition string, skewSet, maxSet bool) error {
	cfg, err := loadConfig(path, adapterName)
	if err != nil {
		return err
	}
	found := findHandlers(cfg)
	if len(found) == 0 {
		return fmt.Errorf("--config: %s has no syncular_segments handler", path)
	}
	var h Handler
	if err := json.Unmarshal(found[0].raw, &h); err != nil {
		return fmt.Errorf("--config: syncular_segments: %w", err)
	}
	if err := h.setDefaults(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	if len(opts.Keys) == 0 {
		if len(h.Keys) == 0 {
			return errors.New("--config: the handler lists no key")
		}
		for i, k := range h.Keys {
			// As given: inspect also diagnoses a config the edge would
			// refuse for a weak key (caddy validate reports that).
			kb, err := secret(repl, k, fmt.Sprintf("key %d", i+1), true)
			if err != nil {
				return err
			}
			opts.Keys = append(opts.Keys, kb)
		}
	}
	if !skewSet {
		opts.Skew = h.skew
	}
	if !maxSet {
		opts.MaxLen = h.MaxTokenLength
	}
	if partition != "" {
		if opts.Audience != "" {
			return errors.New("give --audience or --partition, not both")
		}
		rule, err := h.Audience.build(repl, true)
		if err != nil {
			return err
		}
		opts.Audience = rule.Derive(partition)
	}
	if len(found) > 1 {
		fmt.Fprintf(os.Stderr, "note: %s has %d syncular_segments handlers; using the first\n", path, len(found))
	}
	return nil
}

// flagSecret resolves env:NAME / {env.NAME} and decodes the key like the
// config does. Errors name the flag, never the value.
func flagSecret(flag, raw string) ([]byte, error) {
	if raw == "" {
		return nil, fmt.Errorf("%s is required", flag)
	}
	name, ok := strings.CutPrefix(raw, "env:")
	if !ok && strings.HasPrefix(raw, "{env.") && strings.HasSuffix(raw, "}") {
		name, ok = raw[len("{env."):len(raw)-1], true
	}
	if ok {
		v, set := os.LookupEnv(name)
		if !set || v == "" {
			return nil, fmt.Errorf("%s: environment variable %s is unset or empty", flag, name)
		}
		raw = v
	}
	k, err := token.ParseKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return k, nil
}
