// Package version holds this module's version as the build stamped it.
//
// The build (make caddy: scripts/version.sh, then
// internal/tools/buildcaddy -version) sets Version with
//
//	-ldflags "-X github.com/syncular/caddy-syncular/internal/version.Version=v0.1.0"
//
// because builds here run with -buildvcs=false and a plugin compiled
// from a local directory carries no version of its own in the binary's
// build information. A binary built another way (xcaddy from a published
// tag, go build without the flag) keeps the default below; Get then falls
// back to the module version recorded in the build information.
package version

import "runtime/debug"

// ModulePath is this module's import path.
const ModulePath = "github.com/syncular/caddy-syncular"

// Version is set at link time; see the package comment.
var Version = ""

// Get returns the version to report: the stamped Version, else the
// module's version in the binary's build information (a tag when built
// with xcaddy from a release, v0.0.0 or "(devel)" from a checkout),
// else "(devel)".
func Get() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path == ModulePath && bi.Main.Version != "" {
			return bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path != ModulePath {
				continue
			}
			if d.Replace != nil {
				// xcaddy's --with module@v0.0.0=dir records v0.0.0
				// replaced by a directory: a working tree, not a
				// release, whatever version the replace line names.
				if d.Replace.Version != "" {
					return d.Replace.Version
				}
				return "(devel)"
			}
			if d.Version != "" {
				return d.Version
			}
		}
	}
	return "(devel)"
}
