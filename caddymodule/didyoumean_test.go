package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Unknown subdirectives and values name the nearest known one when one
// is close; a word far from every known one gets no guess.
func TestDidYouMean(t *testing.T) {
	wrap := func(block string) string {
		return "syncular_segments {\n key k\n audience template a:{partition}\n" + block + "\n}"
	}
	for block, want := range map[string]string{
		"stroe sqlite db":                              `unknown subdirective "stroe" (did you mean "store"?)`,
		"store sqlite db\n delivrey proxy":             `unknown subdirective "delivrey" (did you mean "delivery"?)`,
		"store sqlite db\n delivery proxi":             `delivery must be serve, redirect or proxy, not "proxi" (did you mean "proxy"?)`,
		"store sqlit db":                               `unknown store backend "sqlit" (want sqlite or s3) (did you mean "sqlite"?)`,
		"store s3 {\n bucket b\n prefx p/\n }":         `store s3: unknown subdirective "prefx" (did you mean "prefix"?)`,
		"store sqlite db\n cache {\n disc /x\n }":      `cache: unknown subdirective "disc" (did you mean "disk"?)`,
		"store sqlite db\n untokened rejet":            `(did you mean "reject"?)`,
		"store sqlite db\n frobnicate 1":               `unknown subdirective "frobnicate"`,
		"store sqlite db\n cache {\n disk_best /x\n }": `cache: unknown subdirective "disk_best"`,
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap(block)))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", block, err, want)
		}
		if strings.Contains(want, "frobnicate") && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%q: a guess for a word near nothing: %v", block, err)
		}
	}
	if s := didYouMean("kye", []string{"key", "keys"}); s != ` (did you mean "key"?)` {
		t.Errorf("kye: %q", s)
	}
	if s := didYouMean("store", []string{"store"}); s != "" {
		t.Errorf("an exact match: %q", s)
	}
}
