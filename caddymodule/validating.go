package caddymodule

import (
	"os"
	"slices"
)

// validatingOnly reports whether this process only validates a config:
// `caddy validate`, or `caddy adapt --validate`. Caddy provisions every
// module then, as for a real start, and offers no way to tell (no field
// of caddy.Context, no global), so the command line is read. Provision
// uses it to check what it would otherwise create (the disk tier's
// directory and marker) without creating it. A test replaces it
// (export_test.go).
var validatingOnly = func() bool { return validatingArgs(os.Args) }

func validatingArgs(args []string) bool {
	if len(args) < 2 {
		return false
	}
	switch args[1] {
	case "validate":
		return true
	case "adapt":
		return slices.Contains(args[2:], "--validate")
	}
	return false
}
