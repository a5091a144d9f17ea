package caddymodule

import (
	"fmt"
	"slices"

	"github.com/syncular/caddy-syncular/compress"
)

// The compress option: which content codings the answers may have
// (respond.go sends them).

// compressOff is the value of Compress that turns compression off.
const compressOff = "off"

// compressPrefs resolves Handler.Compress: nil or empty is the default
// order (zstd, gzip); ["off"] is none (an empty, non-nil slice). Every
// other list names codings, each once.
func compressPrefs(list []string) ([]compress.Coding, error) {
	if len(list) == 0 {
		return compress.DefaultPrefs(), nil
	}
	if len(list) == 1 && list[0] == compressOff {
		return []compress.Coding{}, nil
	}
	prefs := make([]compress.Coding, 0, len(list))
	for _, name := range list {
		c, ok := compress.ParseCoding(name)
		if !ok || c == compress.Identity || name != c.String() {
			return nil, fmt.Errorf("compress: unknown coding %q (want zstd, gzip, or off alone)", name)
		}
		if slices.Contains(prefs, c) {
			return nil, fmt.Errorf("compress: %s listed twice", name)
		}
		prefs = append(prefs, c)
	}
	return prefs, nil
}

// provisionCompress resolves Compress (checkConfig checked it); the
// store's cache keeps the variants.
func (h *Handler) provisionCompress() error {
	prefs, err := compressPrefs(h.Compress)
	if err != nil {
		return err
	}
	h.codings = prefs
	return nil
}
