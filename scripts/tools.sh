#!/usr/bin/env bash
# Installs the tools the build and tests need into .tools/bin (owned by this
# repo, git-ignored), once per pinned version: a second run is a no-op.
#   scripts/tools.sh [xcaddy] [versitygw] [hey] [chromium]   (default: xcaddy versitygw)
# chromium is Debian's package (headless browser tests), installed with
# apt-get only when no `chromium` is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin"

XCADDY_VERSION=v0.4.5
VERSITYGW_VERSION=v1.8.0
HEY_VERSION=v0.1.4
VEGETA_VERSION=v12.13.0

install() { # name module version
	local name=$1 mod=$2 ver=$3 stamp="$TOOLS/bin/.$1.version"
	if [[ -x "$TOOLS/bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$ver" ]]; then
		return 0
	fi
	echo "tools: installing $name $ver" >&2
	GOBIN="$TOOLS/bin" GOFLAGS=-buildvcs=false go install "$mod@$ver"
	echo "$ver" >"$stamp"
}

install_chromium() {
	if command -v chromium >/dev/null 2>&1; then
		return 0
	fi
	echo "tools: installing chromium (apt-get)" >&2
	local sudo=()
	[[ $(id -u) -eq 0 ]] || sudo=(sudo)
	"${sudo[@]}" apt-get update
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y chromium
}

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(xcaddy versitygw)
for t in "${want[@]}"; do
	case "$t" in
	xcaddy) install xcaddy github.com/caddyserver/xcaddy/cmd/xcaddy "$XCADDY_VERSION" ;;
	versitygw) install versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION" ;;
	hey) install hey github.com/rakyll/hey "$HEY_VERSION" ;;
	vegeta) install vegeta github.com/tsenart/vegeta/v12 "$VEGETA_VERSION" ;;
	chromium) install_chromium ;;
	*) echo "tools: unknown tool $t" >&2; exit 2 ;;
	esac
done
