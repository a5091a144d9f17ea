#!/usr/bin/env bash
# Prints the version of this checkout, as stamped into bin/caddy:
#   vX.Y.Z                      HEAD is the tag vX.Y.Z and the tree is clean
#   vX.Y.(Z+1)-dev.N.gSHA       N commits after the tag vX.Y.Z
#   v0.0.0-dev.gSHA             no vX.Y.Z tag yet
# with ".dirty" appended to the last two when the working tree has
# changes. Every form is a semantic version Go accepts as a module
# version (a "+build" suffix is not). Builds run with -buildvcs=false, so
# nothing else records the commit; outside a git checkout it prints
# v0.0.0-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! sha=$(git rev-parse --short=12 HEAD 2>/dev/null); then
	echo v0.0.0-dev
	exit 0
fi
dirty=""
if ! git diff --quiet HEAD -- 2>/dev/null; then
	dirty=".dirty"
fi
if [[ -z $dirty ]] && tag=$(git describe --tags --exact-match --match 'v[0-9]*.[0-9]*.[0-9]*' HEAD 2>/dev/null); then
	echo "$tag"
	exit 0
fi
if last=$(git describe --tags --abbrev=0 --match 'v[0-9]*.[0-9]*.[0-9]*' HEAD 2>/dev/null); then
	n=$(git rev-list --count "$last"..HEAD)
	base=${last%%-*}
	IFS=. read -r major minor patch <<<"${base#v}"
	echo "v$major.$minor.$((patch + 1))-dev.$n.g$sha$dirty"
else
	echo "v0.0.0-dev.g$sha$dirty"
fi
