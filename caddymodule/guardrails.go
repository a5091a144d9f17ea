package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/dustin/go-humanize"

	"github.com/syncular/caddy-syncular/store"
)

// Guardrails: settings that are valid but unsafe or without effect. A
// setting the chosen store or delivery ignores is refused (the operator
// meant something the edge will not do); a setting that works but weakens
// the edge is a warning, one log line each at provision, naming the
// setting and the fix and never a secret's value. `caddy validate`, `caddy
// run` and every reload print them.

// Thresholds above which a setting is warned about.
const (
	// warnSkew: a token stays valid this long past its exp. The reference
	// allows 60 s; clocks that disagree by more than minutes are a fault
	// to fix, not to tolerate.
	warnSkew = 10 * time.Minute
	// warnRecordTTL: a deleted segment, a removed publication or a
	// rotated logEpoch is still granted for this long.
	warnRecordTTL = time.Minute
)

// checkIgnored refuses settings that the chosen store or delivery ignores.
// It runs before setDefaults, which fills presign_ttl whatever the
// delivery: only here is an explicit presign_ttl told from the default.
func (h *Handler) checkIgnored() error {
	backend := ""
	if h.Store != nil {
		backend = h.Store.Backend
	}
	delivery := h.Delivery
	if delivery == "" {
		delivery = defaultDelivery(backend)
	}
	if h.PresignTTL != 0 && delivery != DeliveryRedirect {
		return fmt.Errorf("presign_ttl applies to delivery redirect only (delivery is %s, which presigns nothing): remove it", delivery)
	}
	if h.VerifyStoreOnStart != nil && backend == backendSQLite {
		return errors.New("verify_store_on_start applies to an s3 store only (a sqlite store is always opened and checked at provision, and a config whose file cannot be opened is refused): remove it")
	}
	if c := h.Cache; c != nil && c.Disk == DiskOff && c.DiskMaxBytes != nil && *c.DiskMaxBytes != 0 {
		return errors.New("cache disk_max_bytes has no effect with disk off: remove one of them")
	}
	return nil
}

// refuseSharedAudienceKey refuses an audience hmac_sha256 key equal to a
// token key. The audience of a partition is then HMAC(token key,
// partition id): a MAC made with the token key over text the edge does
// not control, handed to every client in its tokens' aud claims.
func refuseSharedAudienceKey(keys [][]byte, audKey []byte) error {
	for i, k := range keys {
		if bytes.Equal(k, audKey) {
			return fmt.Errorf("audience hmac_sha256 key is the same as key %d: every audience would then be a MAC "+
				"made with a token key; give the audience rule a separate random key (32 random bytes, e.g. `openssl rand -hex 32`, written hex:<64 hex digits>)", i+1)
		}
	}
	return nil
}

// configWarnings are the warnings of a configuration that passed its
// checks, with defaults applied: one line each, naming the setting and the
// fix, never a secret's value. repl expands placeholders as at provision.
func (h *Handler) configWarnings(repl *caddy.Replacer) []string {
	w := h.secretConfigWarnings(repl) // secrets.go

	if h.skew > warnSkew {
		w = append(w, fmt.Sprintf("syncular_segments: skew %v is above %v: a token is accepted that long after its exp, so a leaked URL "+
			"lives that much longer; keep skew to the clock error you expect (default %v)", h.skew, warnSkew, defaultSkew))
	}
	if c := h.Cache; c != nil {
		if c.RecordTTL != nil && time.Duration(*c.RecordTTL) > warnRecordTTL {
			w = append(w, fmt.Sprintf("syncular_segments: cache record_ttl %v is above %v: a deleted segment, a removed publication or a "+
				"rotated logEpoch is still granted for that long; keep it to seconds (default %v)", time.Duration(*c.RecordTTL), warnRecordTTL, store.DefaultRecordTTL))
		}
		if c.MaxEntry != nil {
			maxBytes := h.cacheOpts.MaxBytes
			if *c.MaxEntry > maxBytes {
				w = append(w, fmt.Sprintf("syncular_segments: cache max_entry %s is above max_bytes %s: no segment larger than max_bytes is "+
					"cached, so max_entry acts as %s; lower max_entry or raise max_bytes", iBytes(*c.MaxEntry), iBytes(maxBytes), iBytes(maxBytes)))
			}
		}
	}
	if h.StoreQueueWait >= h.StoreTimeout && (h.StoreConcurrency == nil || *h.StoreConcurrency > 0) {
		w = append(w, fmt.Sprintf("syncular_segments: store_queue_wait %v is not below store_timeout %v, which bounds a store read's "+
			"wait for a slot and the read together: a read admitted late times out (504) instead of running; lower store_queue_wait "+
			"(default %v) or raise store_timeout", time.Duration(h.StoreQueueWait), time.Duration(h.StoreTimeout), defaultStoreQueueWait))
	}
	if s := h.Store; s != nil && s.Backend == backendS3 && s.S3 != nil {
		if p := repl.ReplaceKnown(s.S3.Prefix, ""); p != "" && !strings.HasSuffix(p, "/") {
			w = append(w, fmt.Sprintf("syncular_segments: store s3 prefix %q does not end in \"/\": object keys are the prefix as "+
				"written followed by seg/ and rec/ (protocol §5.2), so the edge reads %sseg/… and %srec/…; a sync server writing "+
				"under %s/ has its prefix written with the /: add the trailing / here too", p, p, p, p))
		}
	}
	w = append(w, h.thresholdWarnings()...) // thresholds.go
	return w
}

// secretWarnings warns about a secret written into the config, and about
// a key file that group or others can read.
//
// A secret that holds no {env.*} or {file.*} placeholder is in the JSON
// config itself, which the admin API serves at /config/ and Caddy saves
// in autosave.json. That is also what a Caddyfile's {$VAR} becomes: the
// Caddyfile lexer substitutes {$VAR} in the raw text before it makes
// tokens, so no directive (and no provision) can tell {$VAR} from a
// literal; what is detectable, and what matters, is that the value is in
// the config.
func secretWarnings(repl *caddy.Replacer, what, raw string) []string {
	var w []string
	indirect := false
	_, _ = repl.ReplaceFunc(raw, func(name string, val any) (any, error) {
		switch {
		case strings.HasPrefix(name, "env."):
			indirect = true
		case strings.HasPrefix(name, "file."):
			indirect = true
			if msg := keyFileWarning(what, strings.TrimPrefix(name, "file.")); msg != "" {
				w = append(w, msg)
			}
		}
		return val, nil
	})
	if !indirect {
		w = append(w, fmt.Sprintf("syncular_segments: %s is written in the config (a literal, or a Caddyfile {$VAR}, which is expanded "+
			"when the Caddyfile is adapted), so the admin API's /config/ and autosave.json hold it; write it as {env.NAME} or "+
			"{file.PATH}, which are expanded only at provision", what))
	}
	return w
}

// keyFileWarning warns when group or others have any access to a key
// file: the rule ssh applies to private keys (mode & 0077).
func keyFileWarning(what, path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "" // expanding the placeholder reports a missing file
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Sprintf("syncular_segments: %s: file %s is accessible to group or others (mode %04o); chmod 600 it (or 400), owned by the user Caddy runs as", what, path, perm)
	}
	return ""
}

// warnConfig logs configWarnings.
func (h *Handler) warnConfig(repl *caddy.Replacer) {
	for _, msg := range h.configWarnings(repl) {
		h.logger.Warn(msg)
	}
}

func iBytes(n int64) string {
	if n < 0 {
		n = 0
	}
	return humanize.IBytes(uint64(n))
}
