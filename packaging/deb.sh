#!/usr/bin/env bash
# Builds a Debian package of warden: /usr/bin/warden with its instance image beside it, a
# systemd unit, a config file (a conffile: an operator's edits survive upgrades) and the docs.
#
#   bash packaging/deb.sh                    # release build, then target/debian/warden_VERSION_ARCH.deb
#   bash packaging/deb.sh --bin-dir DIR      # package the warden and warden-instance already in DIR
#   bash packaging/deb.sh --out DIR          # write the package to DIR
#   bash packaging/deb.sh --compress none    # xz (the default), gzip or none: tests package a
#                                            # debug build, which xz takes minutes over
#
# Needs dpkg-deb (Debian's dpkg). Installing it: `apt-get install ./warden_*.deb`, then
# `systemctl enable --now warden`; the admin token is in /var/lib/warden/admin-token.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=""
out="target/debian"
compress="xz"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --compress) compress="$2"; shift 2 ;;
    *) echo "unknown argument $1; see the top of $0" >&2; exit 2 ;;
  esac
done
if [ -z "$bin_dir" ]; then
  cargo build --release --locked -p warden
  bin_dir="target/release"
fi
for b in warden warden-instance; do
  [ -x "$bin_dir/$b" ] || { echo "no $bin_dir/$b: build it first (cargo build --release -p warden)" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

install -D -m 0755 "$bin_dir/warden" "$root/usr/bin/warden"
install -D -m 0755 "$bin_dir/warden-instance" "$root/usr/bin/warden-instance"
install -D -m 0644 packaging/warden.service "$root/lib/systemd/system/warden.service"
install -d -m 0755 "$root/etc/warden"
# The example holds every default; the package's copy keeps state under /var/lib/warden.
sed 's|^data_dir = .*|data_dir = "/var/lib/warden"|' docs/warden.example.toml > "$root/etc/warden/warden.toml"
grep -q '^data_dir = "/var/lib/warden"$' "$root/etc/warden/warden.toml" \
  || { echo "docs/warden.example.toml has no data_dir line to point at /var/lib/warden" >&2; exit 1; }
chmod 0640 "$root/etc/warden/warden.toml"
install -D -m 0644 README.md "$root/usr/share/doc/warden/README.md"
for d in ARCHITECTURE SECURITY BENCHMARKS; do
  install -m 0644 "docs/$d.md" "$root/usr/share/doc/warden/$d.md"
done

install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: warden
Version: $version
Architecture: $arch
Maintainer: warden developers <warden@localhost>
Installed-Size: $size
Depends: util-linux
Recommends: postgresql, python3-venv, nodejs, npm, git
Suggests: etcd-server
Section: net
Priority: optional
Description: a self-hosted platform for web apps whose users must not see each other's data
 One gateway authenticates every request and routes it to a sandboxed instance of the app
 running at the user's clearance; node agents start and heal instances; all state lives in
 an embedded store (or etcd on several machines). See /usr/share/doc/warden/README.md.
CONTROL
echo /etc/warden/warden.toml > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
install -d -m 0700 /var/lib/warden
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
POSTINST
cat > "$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl stop warden.service >/dev/null 2>&1 || true
fi
PRERM
cat > "$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
# State (/var/lib/warden: the store, apps' slugs and data, keys) stays unless purged.
if [ "$1" = purge ]; then
  rm -rf /var/lib/warden
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
POSTRM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/warden_${version}_${arch}.deb"
dpkg-deb --build --root-owner-group -Z"$compress" "$root" "$deb" >/dev/null
echo "$deb"
