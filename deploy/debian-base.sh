#!/usr/bin/env bash
# Builds a Python 3.11 base image from Debian bookworm packages alone (debootstrap, no
# image registry) and imports it into podman or docker. deploy/Dockerfile builds on it
# with --build-arg BASE=<the tag>. For hosts that cannot pull python:3.11-slim-bookworm.
#
#   bash deploy/debian-base.sh [TAG]      # default TAG: localhost/samplecache-base:bookworm
#
# Needs root, debootstrap and a Debian mirror (DEBIAN_MIRROR, default deb.debian.org).
# ENGINE=docker imports into docker instead of podman. The rootfs is built in a
# directory under TMPDIR (default /var/tmp) that is removed on exit.
set -euo pipefail
tag="${1:-localhost/samplecache-base:bookworm}"
engine="${ENGINE:-podman}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# python3.11 (Debian's python3), venv for the build stage, `python` for the HEALTHCHECK,
# CA certificates for HTTPS remote stores.
packages="python3,python3-venv,python-is-python3,ca-certificates"

work="$(mktemp -d -p "${TMPDIR:-/var/tmp}" samplecache-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
# apt's lists and caches, docs and man pages: nothing the daemon needs.
rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/*.bin \
       "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/*
tar --numeric-owner -C "$work/rootfs" -c . \
  | "$engine" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "$tag"
