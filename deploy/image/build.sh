#!/usr/bin/env bash
# `make image`: gpufed's OCI image, built with buildah from a Debian base made by mmdebstrap, with no
# Docker engine and no image registry (docs/deploy.md, "Image").
#
# Three layers, each cached where it can be, so that a second build redoes only what changed:
#   1. base: Debian `stable`, Essential packages plus python3, libstdc++ (grpc's C++ core) and
#      ca-certificates, docs and locales left out by dpkg. A tarball under $BUILD_DIR, kept until its
#      recipe (this file's BASE_* settings) changes. Remove $BUILD_DIR to pick up Debian's updates.
#   2. deps: a venv at /opt/gpufed with gpufed's dependencies under constraints.txt, committed as the
#      image localhost/gpufed-deps:<key>, kept until the base, pyproject.toml or constraints.txt change.
#   3. the placer compiled with mypyc for the image's Python (docs/placement-compiled.md), in a build
#      container from a second Debian base that has a C compiler and Python's headers; committed as
#      localhost/gpufed-placer:<key> and kept until the placer's sources, mypy's version or that base
#      change. Only the built libraries are copied into the image: no compiler ships.
#   4. gpufed itself, from a wheel built from the committed tree (git HEAD), the user, the labels.
# uv downloads into a cache under $BUILD_DIR (mounted into the build), so rebuilding the deps layer
# after a pin change fetches only what changed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"

IMAGE=${IMAGE:-localhost/gpufed}
BUILD_DIR=${BUILD_DIR:-$REPO/build/image}
UV=${UV:-$REPO/.venv/bin/uv}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
SUITE=${SUITE:-stable}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# The one fixed, unprivileged account the server runs as: a Pod's runAsUser/fsGroup name it.
GPUFED_UID=10001
# The build container reaches PyPI through this machine's trust store (which may hold a proxy's CA);
# it is mounted for the install step only and never copied into the image.
BUILD_CA=${BUILD_CA:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}

# What the runtime needs and nothing more: no apt, no compilers, no docs. python3 is Debian's
# (3.13 in trixie); libstdc++6 is not Essential but grpcio's extension links it.
BASE_PACKAGES=python3,libstdc++6,ca-certificates
BASE_OPTS=(
  --mode=root --variant=essential --include="$BASE_PACKAGES"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
)

# The placer's build container: the runtime's python3 plus what mypyc needs to build C extensions.
BUILD_BASE_PACKAGES=python3,python3-dev,gcc,libc6-dev,ca-certificates
BUILD_BASE_OPTS=(
  --mode=root --variant=essential --include="$BUILD_BASE_PACKAGES"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*'
)

started=$(date +%s)
log() { echo "image: $*"; }
key() { cksum | cut -d' ' -f1; }
# The two steps that download (Debian's archive, PyPI) are tried three times: a mirror's hiccup should
# not fail a CI run. Both start over cleanly.
retry() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    log "attempt $attempt of 3 failed: $1"
    sleep $((attempt * 10))
  done
  return 1
}

containers=()
cleanup() {
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

mkdir -p "$BUILD_DIR"
base_key=$(printf '%s\n' "$SUITE" "$MIRROR" "${BASE_OPTS[@]}" | key)

# 1. The base tarballs, each made only when a layer below that starts from it is built: the buildah
# store keeps those layers between builds and between clones. `debian_tarball NAME KEY OPTS...` sets
# `tarball` to $BUILD_DIR/NAME-SUITE-KEY.tar, made by mmdebstrap with OPTS unless it is there. Written
# beside its final name and renamed, so that an interrupted build never leaves a truncated tarball
# that a later build would trust.
debian_tarball() {
  local name=$1 tar_key=$2
  shift 2
  tarball=$BUILD_DIR/$name-$SUITE-$tar_key.tar
  if [[ ! -s $tarball ]]; then
    log "making the Debian $SUITE $name with mmdebstrap (a few minutes)"
    rm -f "$BUILD_DIR/$name"-*.tar "$BUILD_DIR/$name"-*.tar.part
    retry mmdebstrap --quiet --format=tar "$@" "$SUITE" "$tarball.part" "$MIRROR"
    mv "$tarball.part" "$tarball"
  else
    log "$name: cached $(basename "$tarball")"
  fi
}

# 2. The wheel, from the committed tree: what the revision label names is what is installed, whatever
# is uncommitted in the work tree. The gRPC stubs are generated here as in `make proto`.
revision=$(git rev-parse HEAD)
src=$BUILD_DIR/src
dist=$BUILD_DIR/dist-$revision
if ! compgen -G "$dist/gpufed-*.whl" >/dev/null; then
  log "building the wheel of $revision"
  rm -rf "$src" "$BUILD_DIR"/dist-*
  mkdir -p "$src"
  git archive HEAD | tar -x -C "$src"
  (cd "$src" && "$PYTHON" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. federation/api/v1/gpufed.proto)
  "$UV" build --quiet --wheel --out-dir "$dist" "$src"
  rm -rf "$src"
fi
wheel=$(basename "$(compgen -G "$dist/gpufed-*.whl" | head -1)")
version=${wheel#gpufed-}
version=${version%%-*}
git show HEAD:constraints.txt >"$dist/constraints.txt"

uv_mounts=(
  -v "$UV:/usr/local/bin/uv:ro"
  -v "$dist:/dist:ro"
  -v "$BUILD_DIR/uv-cache:/uv-cache"
  -v "$BUILD_CA:/run/build-ca.crt:ro"
  --env UV_CACHE_DIR=/uv-cache --env UV_LINK_MODE=copy --env UV_PYTHON_DOWNLOADS=never
  --env SSL_CERT_FILE=/run/build-ca.crt
)
mkdir -p "$BUILD_DIR/uv-cache"

# 3. The dependencies' layer, reused until what decides it changes.
deps_key=$( (echo "$base_key"; git show HEAD:pyproject.toml HEAD:constraints.txt) | key)
deps_image=localhost/gpufed-deps:$deps_key
if ! buildah inspect --type image "$deps_image" >/dev/null 2>&1; then
  debian_tarball base "$base_key" "${BASE_OPTS[@]}"
  log "installing the dependencies into a fresh base"
  ctr=$(buildah from --quiet scratch)
  containers+=("$ctr")
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  # gpufed is installed to resolve its dependencies, then removed: the next layer brings its own.
  retry buildah run --isolation chroot "${uv_mounts[@]}" "$ctr" -- sh -euc "
    uv venv --quiet --allow-existing --python /usr/bin/python3 /opt/gpufed
    uv pip install --quiet --python /opt/gpufed/bin/python -c /dist/constraints.txt /dist/$wheel
    uv pip uninstall --quiet --python /opt/gpufed/bin/python gpufed
    rm -rf /var/cache/* /var/lib/apt/lists/* /var/log/*
  "
  old_deps=$(buildah images --quiet --filter reference='localhost/gpufed-deps' 2>/dev/null || true)
  buildah commit --quiet --rm "$ctr" "$deps_image" >/dev/null
  containers=()
  # Earlier deps layers are superseded; only the newest is kept (each is over a gigabyte).
  for id in $old_deps; do buildah rmi --force "$id" >/dev/null 2>&1 || true; done
else
  log "deps: cached $deps_image"
fi

# 4. The placer compiled for the image's Python, reused until what decides it changes: the placer's
# sources and the compile tool as committed (git's tree ids, not the archive, whose headers carry the
# commit's time), the mypy the project's venv has, and the build base.
mypy_version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("mypy"))')
build_base_key=$(printf '%s\n' "$SUITE" "$MIRROR" "${BUILD_BASE_OPTS[@]}" | key)
placer_key=$(git rev-parse HEAD:placement HEAD:tools/compile_placement.py HEAD:pyproject.toml \
  | (cat; echo "$mypy_version $build_base_key") | key)
placer_image=localhost/gpufed-placer:$placer_key
if ! buildah inspect --type image "$placer_image" >/dev/null 2>&1; then
  # The placer's build base: the runtime's python3 plus a C compiler and Python's headers.
  debian_tarball buildbase "$build_base_key" "${BUILD_BASE_OPTS[@]}"
  log "compiling the placer with mypyc (mypy $mypy_version) for the image's Python"
  placer_src=$BUILD_DIR/placer-src
  rm -rf "$placer_src"
  mkdir -p "$placer_src"
  git archive HEAD placement tools/compile_placement.py pyproject.toml | tar -x -C "$placer_src"
  ctr=$(buildah from --quiet scratch)
  containers+=("$ctr")
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  buildah copy --quiet "$ctr" "$placer_src" /src >/dev/null
  retry buildah run --isolation chroot "${uv_mounts[@]}" "$ctr" -- sh -euc "
    uv venv --quiet --allow-existing --python /usr/bin/python3 /opt/build
    uv pip install --quiet --python /opt/build/bin/python mypy==$mypy_version setuptools
  "
  # --require: a build that cannot compile fails here, rather than shipping the interpreted placer.
  buildah run --isolation chroot "$ctr" -- sh -euc "
    cd /src
    /opt/build/bin/python tools/compile_placement.py --require
    ls -d /src/.compiled/placement-*
  "
  rm -rf "$placer_src"
  old_placer=$(buildah images --quiet --filter reference='localhost/gpufed-placer' 2>/dev/null || true)
  buildah commit --quiet --rm "$ctr" "$placer_image" >/dev/null
  containers=()
  for id in $old_placer; do buildah rmi --force "$id" >/dev/null 2>&1 || true; done
else
  log "placer: cached $placer_image"
fi

# 5. gpufed, its user and its metadata.
log "installing gpufed $version ($revision)"
ctr=$(buildah from --quiet "$deps_image")
containers+=("$ctr")
site_packages=$(buildah run --isolation chroot "$ctr" -- /opt/gpufed/bin/python -c \
  'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The build sits beside the installed package, where placement/_compiled.py looks for it; it is used
# only if it was built from the installed sources (their digest names it), which the check below asks.
buildah copy --quiet --from "$placer_image" "$ctr" /src/.compiled "$site_packages/.compiled" >/dev/null
buildah run --isolation chroot "${uv_mounts[@]}" "$ctr" -- sh -euc "
  uv pip install --quiet --no-deps --python /opt/gpufed/bin/python /dist/$wheel
  # The root filesystem is read-only at run time, so Python could not cache bytecode then: compile
  # gpufed, and every module a server or the CLI imports, now.
  cd /opt/gpufed/lib/python3*/site-packages
  /opt/gpufed/bin/python -m compileall -q -j0 federation clusters placement datasync iac
  cd /
  /opt/gpufed/bin/python -c 'import federation.cli.main, federation.runtime.serve, federation.runtime.server'
  /opt/gpufed/bin/python -c 'import placement, sys; placement.COMPILED or sys.exit(\"the image would run the interpreted placer: no build of its installed sources\")'
  echo 'gpufed:x:$GPUFED_UID:$GPUFED_UID:gpufed:/var/lib/gpufed:/usr/sbin/nologin' >> /etc/passwd
  echo 'gpufed:x:$GPUFED_UID:' >> /etc/group
  mkdir -p /var/lib/gpufed
  chown $GPUFED_UID:$GPUFED_UID /var/lib/gpufed
  chmod 0750 /var/lib/gpufed
"
source_url=${IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || echo "unknown")}
buildah config \
  --user "$GPUFED_UID:$GPUFED_UID" \
  --workingdir /var/lib/gpufed \
  --entrypoint '["/opt/gpufed/bin/gpufed"]' \
  --cmd '["--help"]' \
  --env PATH=/opt/gpufed/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env HOME=/var/lib/gpufed \
  --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 \
  --env MPLCONFIGDIR=/tmp/matplotlib \
  --port 50051 \
  --label org.opencontainers.image.title=gpufed \
  --label "org.opencontainers.image.description=Federation control plane for GPU training jobs" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=$source_url" \
  --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.base.name=debian:$SUITE (mmdebstrap, variant essential)" \
  "$ctr"
# The root filesystem's size, as the image unpacks on a node (what `docker images` would show).
size_mb=$(du -sm "$(buildah mount "$ctr")" | cut -f1)
buildah umount "$ctr" >/dev/null
old_image=$(buildah images --quiet --filter reference="$IMAGE:$version" 2>/dev/null || true)
buildah commit --quiet --rm "$ctr" "$IMAGE:$version" >/dev/null
containers=()
buildah tag "$IMAGE:$version" "$IMAGE:latest"
new_image=$(buildah images --quiet --filter reference="$IMAGE:$version")
# The image this build replaced under the same tags goes, unless something else still names it.
if [[ -n $old_image && $old_image != "$new_image" ]]; then
  buildah rmi "$old_image" >/dev/null 2>&1 || true
fi
log "built $IMAGE:$version and $IMAGE:latest (revision $revision) in $(($(date +%s) - started)) s"
log "image_size_mb: $size_mb MB"
