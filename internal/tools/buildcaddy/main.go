// Command buildcaddy builds a custom Caddy with xcaddy from the manifest
// xcaddy.json: the Caddy version and the plugins to compile in. A plugin
// with "replace" is built from that local directory (relative to the
// manifest); xcaddy then needs a placeholder version, or it asks the
// module proxy for one and fails.
//
//	go run ./internal/tools/buildcaddy [-manifest xcaddy.json] [-xcaddy path] [-plain] [-version v] -o bin/caddy
//
// -plain builds stock Caddy of the same version (no plugins), for
// side-by-side benchmarks.
//
// -version (make caddy passes scripts/version.sh's output) replaces the
// placeholder version of this module's local plugin, so
// `caddy list-modules --versions` shows it, and stamps it into
// internal/version.Version with -ldflags -X. Builds run with
// -buildvcs=false, so nothing else records which commit was built.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// selfModule is this repository's module: the plugin -version applies to.
const selfModule = "github.com/syncular/caddy-syncular"

// defaultBuildFlags are the flags xcaddy uses when XCADDY_GO_BUILD_FLAGS
// is unset; setting it (to add -X) replaces them, so they are repeated.
const defaultBuildFlags = "-trimpath -tags nobadger,nomysql,nopgx"

type manifest struct {
	Xcaddy  string `json:"xcaddy"`
	Caddy   string `json:"caddy"`
	Plugins []struct {
		Module  string `json:"module"`
		Version string `json:"version"`
		Replace string `json:"replace"`
	} `json:"plugins"`
}

func main() {
	manPath := flag.String("manifest", "xcaddy.json", "build manifest")
	xcaddy := flag.String("xcaddy", ".tools/bin/xcaddy", "xcaddy binary")
	out := flag.String("o", "bin/caddy", "output binary")
	plain := flag.Bool("plain", false, "build stock Caddy without plugins")
	version := flag.String("version", "", "version of this module to stamp (default: the manifest's placeholder, unstamped)")
	flag.Parse()
	if *version != "" && !strings.HasPrefix(*version, "v") {
		fmt.Fprintf(os.Stderr, "buildcaddy: -version %q: want a semantic version such as v0.1.0\n", *version)
		os.Exit(2)
	}
	if err := run(*manPath, *xcaddy, *out, *plain, *version); err != nil {
		fmt.Fprintln(os.Stderr, "buildcaddy:", err)
		os.Exit(1)
	}
}

func run(manPath, xcaddy, out string, plain bool, version string) error {
	raw, err := os.ReadFile(manPath)
	if err != nil {
		return err
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("%s: %w", manPath, err)
	}
	if m.Caddy == "" {
		return fmt.Errorf("%s: caddy version missing", manPath)
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	args := []string{"build", m.Caddy, "--output", absOut}
	if !plain {
		base := filepath.Dir(manPath)
		for _, p := range m.Plugins {
			with := p.Module
			v := p.Version
			if version != "" && p.Module == selfModule && p.Replace != "" {
				v = version
			}
			if v != "" {
				with += "@" + v
			}
			if p.Replace != "" {
				dir, err := filepath.Abs(filepath.Join(base, p.Replace))
				if err != nil {
					return err
				}
				with += "=" + dir
			}
			args = append(args, "--with", with)
		}
	}
	if err := os.MkdirAll(filepath.Dir(absOut), 0o755); err != nil {
		return err
	}
	cmd := exec.Command(xcaddy, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if version != "" && !plain {
		flags := fmt.Sprintf("-ldflags '-w -s -X %s/internal/version.Version=%s' %s", selfModule, version, defaultBuildFlags)
		cmd.Env = append(os.Environ(), "XCADDY_GO_BUILD_FLAGS="+flags)
		fmt.Fprintln(os.Stderr, "buildcaddy: XCADDY_GO_BUILD_FLAGS="+flags)
	}
	fmt.Fprintln(os.Stderr, "buildcaddy:", xcaddy, args)
	return cmd.Run()
}
