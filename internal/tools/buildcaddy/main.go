// Command buildcaddy builds a custom Caddy with xcaddy from the manifest
// xcaddy.json: the Caddy version and the plugins to compile in. A plugin
// with "replace" is built from that local directory (relative to the
// manifest); xcaddy then needs a placeholder version, or it asks the
// module proxy for one and fails.
//
//	go run ./internal/tools/buildcaddy [-manifest xcaddy.json] [-xcaddy path] [-plain] -o bin/caddy
//
// -plain builds stock Caddy of the same version (no plugins), for
// side-by-side benchmarks.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

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
	flag.Parse()
	if err := run(*manPath, *xcaddy, *out, *plain); err != nil {
		fmt.Fprintln(os.Stderr, "buildcaddy:", err)
		os.Exit(1)
	}
}

func run(manPath, xcaddy, out string, plain bool) error {
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
			if p.Version != "" {
				with += "@" + p.Version
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
	fmt.Fprintln(os.Stderr, "buildcaddy:", xcaddy, args)
	return cmd.Run()
}
