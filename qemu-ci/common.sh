# SPDX-License-Identifier: GPL-2.0
# Shared settings for the qemu-ci scripts. Source it; do not run it.
#
# Everything expensive (kernel source and build, guest image, rdma-core source) lives in
# $CACHE outside the repository, keyed by a hash of its inputs, so a warm run reuses it.

set -euo pipefail

QEMU_CI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$QEMU_CI_DIR/.." && pwd)"
CACHE="${METAROCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metaroce}"
mkdir -p "$CACHE"

# Pinned versions of everything we build against.
KERNEL_PKG="linux-source-7.3"
KERNEL_SUITE="trixie-backports"
GUEST_SUITE="trixie"
RDMA_CORE_VERSION="56.1"
LLVM_VERSION=22
BINDGEN_VERSION="0.73.2"

export PATH="/usr/lib/llvm-${LLVM_VERSION}/bin:$HOME/.cargo/bin:$PATH"

# A script whose stdout is its result (a path that another script or the Makefile captures)
# calls stdout_is_result first. From then on everything it and the tools it runs print goes to
# stderr, so no progress output (apt's "Get:1 ...", cmake, cargo) can end up in the capture;
# only `result` writes to the real stdout.
stdout_is_result() { exec 3>&1 1>&2; }
result() { printf '%s\n' "$*" >&3; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The Debian mirror the host already uses (never hard-coded in the repo).
host_mirror() {
	local uri=""
	if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
		uri=$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources |
			grep -v -- '-security' | head -n1 || true)
	fi
	if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
			/etc/apt/sources.list)
	fi
	[ -n "$uri" ] || die "cannot find a Debian mirror in the host's apt configuration"
	echo "${uri%/}"
}

# A private apt configuration for other suites: the host's sources and state stay untouched.
PRIVATE_APT="$CACHE/apt"
private_apt_init() {
	local mirror
	mirror=$(host_mirror)
	mkdir -p "$PRIVATE_APT"/{lists/partial,archives/partial,etc/preferences.d,etc/sources.list.d}
	cat >"$PRIVATE_APT/etc/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $GUEST_SUITE main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $KERNEL_SUITE main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $GUEST_SUITE main
EOF
	private_apt update -qq
}
private_apt() {
	apt-get \
		-o Dir::Etc::SourceList="$PRIVATE_APT/etc/sources.list" \
		-o Dir::Etc::SourceParts="$PRIVATE_APT/etc/sources.list.d" \
		-o Dir::Etc::Preferences="$PRIVATE_APT/etc/preferences" \
		-o Dir::Etc::PreferencesParts="$PRIVATE_APT/etc/preferences.d" \
		-o Dir::State::Lists="$PRIVATE_APT/lists" \
		-o Dir::Cache::Archives="$PRIVATE_APT/archives" \
		-o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache="" \
		-o Debug::NoLocking=1 "$@"
}

# sha256 of the given files (their contents, not their paths: a clone elsewhere shares the
# cache) and strings, short.
input_hash() {
	{
		for a in "$@"; do
			if [ -f "$a" ]; then sha256sum <"$a"; else echo "$a"; fi
		done
	} | sha256sum | cut -c1-16
}

# A directory is complete only once its .done marker exists; builds write elsewhere first.
cache_ready() { [ -f "$1/.done" ]; }
