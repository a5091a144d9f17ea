#!/usr/bin/env bash
# Installs the tools the build and tests need into .tools/bin (owned by this
# repo, git-ignored), once per pinned version: a second run is a no-op.
#   scripts/tools.sh [xcaddy] [versitygw] [staticcheck] [hey] [vegeta] [chromium] [strace] [nginx] [prometheus]
#   (default: xcaddy versitygw)
# chromium (headless browser tests), strace (the sendfile test counts the
# edge's system calls), nginx (a peer in the benchmark) and prometheus
# (with promtool: the monitoring test runs its own server on loopback;
# the package's system service plays no part) are Debian's packages,
# installed with apt-get only when the command is not found.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin"

XCADDY_VERSION=v0.4.5
VERSITYGW_VERSION=v1.8.0
HEY_VERSION=v0.1.4
VEGETA_VERSION=v12.13.0
# staticcheck 2026.2.2 is the module version v0.8.2 of honnef.co/go/tools.
STATICCHECK_VERSION=v0.8.2

install() { # name module version
	local name=$1 mod=$2 ver=$3 stamp="$TOOLS/bin/.$1.version"
	if [[ -x "$TOOLS/bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$ver" ]]; then
		return 0
	fi
	echo "tools: installing $name $ver" >&2
	GOBIN="$TOOLS/bin" GOFLAGS=-buildvcs=false go install "$mod@$ver"
	echo "$ver" >"$stamp"
}

install_apt() { # command package
	local cmd=$1 pkg=$2
	# nginx lives in /usr/sbin, which a non-root PATH may lack.
	if command -v "$cmd" >/dev/null 2>&1 || [[ -x /usr/sbin/$cmd || -x /usr/bin/$cmd ]]; then
		return 0
	fi
	echo "tools: installing $pkg (apt-get)" >&2
	local sudo=()
	[[ $(id -u) -eq 0 ]] || sudo=(sudo)
	"${sudo[@]}" apt-get update
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "$pkg"
}

want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=(xcaddy versitygw)
for t in "${want[@]}"; do
	case "$t" in
	xcaddy) install xcaddy github.com/caddyserver/xcaddy/cmd/xcaddy "$XCADDY_VERSION" ;;
	versitygw) install versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION" ;;
	staticcheck) install staticcheck honnef.co/go/tools/cmd/staticcheck "$STATICCHECK_VERSION" ;;
	hey) install hey github.com/rakyll/hey "$HEY_VERSION" ;;
	vegeta) install vegeta github.com/tsenart/vegeta/v12 "$VEGETA_VERSION" ;;
	chromium) install_apt chromium chromium ;;
	strace) install_apt strace strace ;;
	nginx) install_apt nginx nginx ;;
	prometheus) install_apt promtool prometheus ;;
	*) echo "tools: unknown tool $t" >&2; exit 2 ;;
	esac
done
