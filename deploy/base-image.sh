#!/bin/sh
# Builds the base image deploy/Dockerfile starts from when Docker Hub cannot be reached (the air-gapped path,
# docs/docker.md): a Debian root file system from the Debian mirror this host's apt uses, imported as an image,
# and a Python layer on it standing in for python:3.11-slim.
#   deploy/base-image.sh [TAG]             (TAG default local/python:3.11; also tags local/debian:RELEASE)
#   docker build --network host --build-arg BASE=local/python:3.11 -f deploy/Dockerfile -t sparseps .
# Needs root, debootstrap (Debian: apt install debootstrap) and a running Docker engine. Builds use the host's
# network (no bridge). The images get:
#   - the host's apt sources whose keyrings the root file system has, and the host's apt.conf.d files that set
#     Acquire:: options (proxies, snapshot mirrors): apt inside a build reaches the host's mirror;
#   - the host's CA certificates (/usr/local/share/ca-certificates/*.crt): pip inside a build reaches the package
#     index the host reaches, through the same TLS-inspecting proxy if there is one;
#   - Debian's python3 in a venv at /opt/python, first on PATH, with PIP_CERT set to the system CA bundle.
# Not the host's pip configuration: its local paths do not exist in the image.
# Environment: RELEASE (default: this host's Debian release, else bookworm), DEBIAN_MIRROR (default: the first
# Debian mirror in the host's apt sources).
set -eu
tag=${1:-local/python:3.11}
[ "$(id -u)" = 0 ] || { echo "base-image.sh: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "base-image.sh: needs debootstrap (apt install debootstrap)" >&2; exit 1; }

host_release=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
release=${RELEASE:-${host_release:-bookworm}}

# the first Debian archive (not the security archive) named in the host's apt sources, in either format
first_mirror() {
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed -n -e 's/^deb \(\[[^]]*\] \)\{0,1\}\(https\{0,1\}:[^ ]*\).*/\2/p' -e 's/^URIs: *\(https\{0,1\}:[^ ]*\).*/\1/p' "$f"
    done | grep -v -e security -e nodesource -e cloud.google | head -n 1
}
mirror=${DEBIAN_MIRROR:-$(first_mirror)}
[ -n "$mirror" ] || { echo "base-image.sh: no Debian mirror in /etc/apt; set DEBIAN_MIRROR" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
echo "base-image.sh: debootstrap --variant=minbase $release from $mirror"
debootstrap --variant=minbase "$release" "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    echo "base-image.sh: debootstrap failed" >&2
    exit 1
}

# apt inside the image: the host's sources whose keyrings exist there, and the host's Acquire:: settings
rm -f "$rootfs/etc/apt/sources.list" "$rootfs"/etc/apt/sources.list.d/*
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    usable=yes
    for key in $(sed -n -e 's/.*signed-by=\([^] ]*\).*/\1/p' -e 's/^Signed-By: *\(\/[^ ]*\).*/\1/p' "$f"); do
        [ -e "$rootfs$key" ] || usable=no
    done
    [ "$usable" = yes ] && cp "$f" "$rootfs/etc/apt/${f#/etc/apt/}"
done
for f in /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && grep -q 'Acquire::' "$f" && cp "$f" "$rootfs/etc/apt/apt.conf.d/"
done
# slim as Docker's own Debian images: no package caches, documentation (but the copyrights), manuals or
# translations, now or from later installs
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'END'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
END
cat > "$rootfs/etc/apt/apt.conf.d/slim" <<'END'
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
END

debian=local/debian:$release
tar --numeric-owner -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' - "$debian" >/dev/null
echo "base-image.sh: imported $debian"

mkdir -p "$work/context/certs"
for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -f "$crt" ] && cp "$crt" "$work/context/certs/"
done
cat > "$work/context/Dockerfile" <<EOF
FROM $debian
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/* && update-ca-certificates \\
 && python3 -m venv /opt/python && /opt/python/bin/pip --version
ENV PATH=/opt/python/bin:\$PATH PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
EOF
docker build --network host -t "$tag" "$work/context" >"$work/build.log" 2>&1 || {
    tail -n 30 "$work/build.log" >&2
    echo "base-image.sh: docker build of $tag failed" >&2
    exit 1
}
echo "base-image.sh: built $tag ($(docker run --rm --network host "$tag" python3 --version))"
