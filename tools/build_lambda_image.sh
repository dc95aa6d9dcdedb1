#!/usr/bin/env bash
# Build a stand-in for the Lambda Python base image when it cannot be pulled: the image SAM CLI runs functions in
# (public.ecr.aws/lambda/python:3.13-<arch>), under that exact name, from Debian packages and PyPI only. With it,
# `sam local invoke` and `sam local start-api --skip-pull-image` run on a machine that reaches no container registry.
# `make sam-local` runs this when the image is neither present nor pullable; the image is then reused by name.
#
# What SAM CLI needs from the base image (samcli/local/docker/lambda_image.py, lambda_container.py, container.py):
#   - the name  public.ecr.aws/lambda/python:3.13-x86_64 | -arm64  (python3.13 has multi-arch images, so the tag
#     carries the architecture); SAM builds "samcli/lambda-python:3.13-<arch>-<hash>" FROM it, adding its own RIE
#     at /var/rapid/aws-lambda-rie and the template's layers under /opt, with `docker build --platform linux/<arch>
#     --pull=<not --skip-pull-image>`.
#   - the container runs ENTRYPOINT /var/rapid/aws-lambda-rie --log-level error, no CMD, cwd /var/task (the function's
#     code, bind-mounted read-only), env AWS_LAMBDA_FUNCTION_HANDLER=<Handler> plus the template's variables. The RIE
#     starts the first of /var/task/bootstrap, /opt/bootstrap, /var/runtime/bootstrap.
# So the image provides, as the official one does:
#   /var/lang/bin/python3.13            CPython 3.13
#   /var/runtime/bootstrap{,.py}        sets AWS_EXECUTION_ENV, Lambda's sys.path order, runs awslambdaric
#   /var/runtime/{awslambdaric,boto3,botocore,...}   the runtime client and the SDK the runtime ships
#   /lambda-entrypoint.sh, /usr/local/bin/aws-lambda-rie (when SAM's RIE is found)  for plain `docker run`
#   ENV PATH, LD_LIBRARY_PATH, LAMBDA_TASK_ROOT, LAMBDA_RUNTIME_DIR, LANG, TZ; WORKDIR /var/task
#
# Usage: build_lambda_image.sh [x86_64|arm64]        (default: this machine's architecture)
# Settings (environment, all optional):
#   PYTHON_SOURCE  pyenv:  copy a CPython 3.13 build (PYTHON_PREFIX) to /var/lang on a Debian bookworm base
#                          (this machine's architecture only);
#                  debian: Debian trixie's python3.13 package, /var/lang/bin/python3.13 a link to it (any
#                          architecture this machine can run, arm64 through qemu-user-static + binfmt_misc).
#                  Default: pyenv when PYTHON_PREFIX (or `pyenv prefix 3.13.0`) is a build for ARCH, else debian.
#   PYTHON_PREFIX  the CPython 3.13 prefix for pyenv (default: `pyenv prefix 3.13.0`)
#   SUITE MIRROR   Debian suite and mirror (default bookworm for pyenv, trixie for debian; the mirror apt already uses,
#                  read from /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list)
#   WORK_DIR       scratch space; the debootstrapped rootfs is cached there (default ${TMPDIR:-/tmp}/lambda-image-build)
#   IMAGE          image name (default public.ecr.aws/lambda/python:3.13-$ARCH)
#   RIC_VERSION    awslambdaric version (default 4.2.2)
#   BOTO3_VERSION  boto3 the runtime provides (default: the pin in $PROJECT_DIR/requirements-dev.txt, else newest)
#   PROJECT_DIR    the Agent Jobs checkout whose boto3 pin and .venv are used (default: this script's checkout)
#   PIP            the pip command that cross-installs the runtime packages (default: $PROJECT_DIR/.venv/bin/python
#                  -m pip when it exists, else python3 -m pip)
#   RIE            an aws-lambda-rie binary for ARCH to install at /usr/local/bin (default: the one inside SAM CLI,
#                  found through `sam` on PATH or $PROJECT_DIR/.venv; skipped when none)
# Needs: root, docker (a running daemon), debootstrap; for arm64 also qemu-user-static with binfmt_misc.
set -euo pipefail

log() { printf '[build_lambda_image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
START=$(date +%s)
step_start=$START
step() { local now; now=$(date +%s); log "step done in $((now - step_start)) s: $1"; step_start=$now; }

host_arch() { case "$(uname -m)" in x86_64 | amd64) echo x86_64 ;; aarch64 | arm64) echo arm64 ;; *) uname -m ;; esac; }
ARCH=${1:-${ARCH:-$(host_arch)}}
case "$ARCH" in
  x86_64) DEB_ARCH=amd64 DOCKER_ARCH=amd64 ELF_MACHINE="X86-64" MANYLINUX=x86_64 ;;
  arm64) DEB_ARCH=arm64 DOCKER_ARCH=arm64 ELF_MACHINE="AArch64" MANYLINUX=aarch64 ;;
  *) die "architecture must be x86_64 or arm64, not $ARCH" ;;
esac

PROJECT_DIR=${PROJECT_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
WORK_DIR=${WORK_DIR:-${TMPDIR:-/tmp}/lambda-image-build}
IMAGE=${IMAGE:-public.ecr.aws/lambda/python:3.13-$ARCH}
apt_mirror() {
  local uri
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n 1)
  [ -n "$uri" ] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n 1)
  printf '%s' "$uri"
}
MIRROR=${MIRROR:-$(apt_mirror)}
[ -n "$MIRROR" ] || { echo "no Debian mirror found in apt's sources; set MIRROR" >&2; exit 1; }
RIC_VERSION=${RIC_VERSION:-4.2.2}
if [ -z "${PIP:-}" ]; then
  if [ -x "$PROJECT_DIR/.venv/bin/python" ]; then PIP="$PROJECT_DIR/.venv/bin/python -m pip"; else PIP="python3 -m pip"; fi
fi

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install -y debootstrap"
command -v docker >/dev/null || die "docker missing: apt-get install -y docker.io"
docker info >/dev/null 2>&1 || die "no docker daemon: start one (dockerd >/var/log/dockerd.log 2>&1 &)"

elf_arch() { LC_ALL=C readelf -h "$1" 2>/dev/null | awk -F: '/Machine:/ {gsub(/^ +/, "", $2); print $2}'; }

if [ -z "${PYTHON_SOURCE:-}" ]; then
  PYTHON_SOURCE=debian
  if [ -z "${PYTHON_PREFIX:-}" ] && command -v pyenv >/dev/null; then
    PYTHON_PREFIX=$(pyenv prefix 3.13.0 2>/dev/null || true)
  fi
  if [ -n "${PYTHON_PREFIX:-}" ] && [ -x "$PYTHON_PREFIX/bin/python3.13" ] &&
    elf_arch "$PYTHON_PREFIX/bin/python3.13" | grep -qi "$ELF_MACHINE"; then
    PYTHON_SOURCE=pyenv
  fi
fi
case "$PYTHON_SOURCE" in
  pyenv)
    PYTHON_PREFIX=${PYTHON_PREFIX:-$(pyenv prefix 3.13.0)}
    [ -x "$PYTHON_PREFIX/bin/python3.13" ] || die "no python3.13 under PYTHON_PREFIX=$PYTHON_PREFIX"
    elf_arch "$PYTHON_PREFIX/bin/python3.13" | grep -qi "$ELF_MACHINE" ||
      die "$PYTHON_PREFIX/bin/python3.13 is not a $ARCH build: use PYTHON_SOURCE=debian"
    SUITE=${SUITE:-bookworm}
    INCLUDE=ca-certificates,libssl3,libffi8,libsqlite3-0,libexpat1,libncursesw6,libreadline8,libuuid1,libbz2-1.0,liblzma5,zlib1g
    ;;
  debian)
    SUITE=${SUITE:-trixie}
    INCLUDE=ca-certificates,python3.13
    ;;
  *) die "PYTHON_SOURCE must be pyenv or debian" ;;
esac

# Foreign architectures need qemu's binfmt_misc handler (with the F flag, so it works inside chroot and containers).
if [ "$ARCH" != "$(host_arch)" ]; then
  BINFMT=/proc/sys/fs/binfmt_misc
  [ -e "$BINFMT/status" ] || mount -t binfmt_misc binfmt_misc "$BINFMT" ||
    die "cannot mount binfmt_misc: $ARCH binaries cannot run here"
  if [ ! -e "$BINFMT/qemu-$MANYLINUX" ]; then
    conf=/usr/lib/binfmt.d/qemu-$MANYLINUX.conf
    [ -f "$conf" ] || die "no $conf: apt-get install -y qemu-user-static"
    log "registering $conf with binfmt_misc (this machine's kernel; remove with: echo -1 > $BINFMT/qemu-$MANYLINUX)"
    grep -v '^#' "$conf" | grep . >"$BINFMT/register"
  fi
fi

mkdir -p "$WORK_DIR"
ROOTFS_TAR="$WORK_DIR/rootfs-$SUITE-$DEB_ARCH-$PYTHON_SOURCE.tar"
STAGE="$WORK_DIR/stage-$ARCH"
log "image $IMAGE: $ARCH, python from $PYTHON_SOURCE, Debian $SUITE ($MIRROR), work dir $WORK_DIR"

# 1. Debian minbase rootfs (cached as a tarball; delete it to rebuild).
if [ ! -s "$ROOTFS_TAR" ]; then
  tmp_root="$WORK_DIR/debootstrap-$SUITE-$DEB_ARCH"
  rm -rf "$tmp_root"
  log "debootstrap --variant=minbase --arch=$DEB_ARCH --include=$INCLUDE $SUITE"
  debootstrap --variant=minbase --arch="$DEB_ARCH" --include="$INCLUDE" "$SUITE" "$tmp_root" "$MIRROR" \
    >"$WORK_DIR/debootstrap-$SUITE-$DEB_ARCH.log" 2>&1 ||
    die "debootstrap failed: see $WORK_DIR/debootstrap-$SUITE-$DEB_ARCH.log"
  tar -C "$tmp_root" -cf "$ROOTFS_TAR" .
  rm -rf "$tmp_root"
  step "debootstrap"
else
  log "reusing $ROOTFS_TAR"
fi

rm -rf "$STAGE"
mkdir -p "$STAGE"
tar -C "$STAGE" -xf "$ROOTFS_TAR"
# What a runtime image does not need: package caches and lists, documentation, translations.
rm -rf "$STAGE"/var/cache/apt/* "$STAGE"/var/lib/apt/lists/* "$STAGE"/usr/share/doc/* "$STAGE"/usr/share/man/* \
  "$STAGE"/usr/share/locale/* "$STAGE"/usr/share/info/*
mkdir -p "$STAGE"/var/task "$STAGE"/var/runtime "$STAGE"/var/lang/bin "$STAGE"/opt "$STAGE"/tmp
step "rootfs staged"

# 2. CPython 3.13 at /var/lang.
if [ "$PYTHON_SOURCE" = pyenv ]; then
  # The build's RUNPATH names its own prefix, so /var/lang/lib goes into ld.so's search path (and LD_LIBRARY_PATH,
  # as in the official image). Python itself finds its library relative to the executable.
  tar -C "$PYTHON_PREFIX" -cf - \
    --exclude='./lib/python3.13/test' --exclude='./lib/python3.13/idlelib' --exclude='./lib/python3.13/tkinter' \
    --exclude='./lib/python3.13/turtledemo' --exclude='./lib/python3.13/config-3.13-*/*.a' \
    --exclude='./lib/python3.13/lib-dynload/_tkinter*' --exclude='./share' . | tar -C "$STAGE/var/lang" -xf -
  echo /var/lang/lib >"$STAGE/etc/ld.so.conf.d/var-lang.conf"
  chroot "$STAGE" /sbin/ldconfig
else
  for name in python3.13 python3 python; do ln -sf /usr/bin/python3.13 "$STAGE/var/lang/bin/$name"; done
fi
step "python installed"

# 3. The runtime's own packages in /var/runtime: the runtime interface client and the SDK.
if [ -z "${BOTO3_VERSION:-}" ] && [ -f "$PROJECT_DIR/requirements-dev.txt" ]; then
  BOTO3_VERSION=$(sed -n 's/^boto3==\([^ ;#]*\).*/\1/p' "$PROJECT_DIR/requirements-dev.txt" | head -n1)
fi
boto3_req=boto3${BOTO3_VERSION:+==$BOTO3_VERSION}
log "pip install awslambdaric==$RIC_VERSION $boto3_req --target /var/runtime (manylinux $MANYLINUX, cp313)"
# shellcheck disable=SC2086  # PIP is a command line
$PIP install --quiet --disable-pip-version-check --no-warn-conflicts --no-compile \
  --target "$STAGE/var/runtime" --implementation cp --python-version 3.13 --only-binary=:all: \
  --platform "manylinux2014_$MANYLINUX" --platform "manylinux_2_28_$MANYLINUX" \
  "awslambdaric==$RIC_VERSION" "$boto3_req" 2>&1 | grep -v "^WARNING: Location" >&2 || true
[ -d "$STAGE/var/runtime/awslambdaric" ] || die "awslambdaric did not install into /var/runtime"
rm -rf "$STAGE/var/runtime/bin"
# Byte-compile with the image's own interpreter (as a Lambda runtime ships it): a cold start then reads .pyc files
# instead of compiling boto3 and botocore in every new container.
chroot "$STAGE" /var/lang/bin/python3.13 -m compileall -q /var/runtime >/dev/null || die "compileall failed in the image"
step "runtime packages installed"

# 4. The runtime's entry points, as in the official image.
cat >"$STAGE/var/runtime/bootstrap" <<'EOF'
#!/bin/sh
# Runs the handler named by _HANDLER (or AWS_LAMBDA_FUNCTION_HANDLER, as SAM CLI and the RIE set it).
export AWS_EXECUTION_ENV=AWS_Lambda_python3.13
if [ -z "${AWS_LAMBDA_EXEC_WRAPPER:-}" ]; then
  exec /var/lang/bin/python3.13 /var/runtime/bootstrap.py
fi
if [ ! -x "$AWS_LAMBDA_EXEC_WRAPPER" ]; then
  echo "AWS_LAMBDA_EXEC_WRAPPER $AWS_LAMBDA_EXEC_WRAPPER is not an executable file" >&2
  exit 126
fi
exec "$AWS_LAMBDA_EXEC_WRAPPER" /var/lang/bin/python3.13 /var/runtime/bootstrap.py
EOF
cat >"$STAGE/var/runtime/bootstrap.py" <<'EOF'
"""The Lambda Python runtime's bootstrap: sys.path in Lambda's documented order (/var/task, the layers under /opt,
the interpreter's site-packages, /var/runtime, the standard library), then awslambdaric's loop for the handler."""

import os
import sys


def lambda_sys_path(path: list[str]) -> list[str]:
    task_root = os.environ.get("LAMBDA_TASK_ROOT", "/var/task")
    runtime_dir = os.environ.get("LAMBDA_RUNTIME_DIR", "/var/runtime")
    version = "python%d.%d" % sys.version_info[:2]
    head = [task_root, f"/opt/python/lib/{version}/site-packages", "/opt/python"]
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in path if p and os.path.abspath(p) not in (here, runtime_dir) and p not in head]
    site = [p for p in rest if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return head + site + [runtime_dir] + [p for p in rest if p not in site]


def main() -> None:
    sys.path[:] = lambda_sys_path(sys.path)
    handler = os.environ.get("_HANDLER") or os.environ.get("AWS_LAMBDA_FUNCTION_HANDLER") or ""
    if not handler and len(sys.argv) > 1:
        handler = sys.argv[1]
    if not handler:
        sys.exit("no handler: set _HANDLER or AWS_LAMBDA_FUNCTION_HANDLER")
    os.environ["_HANDLER"] = handler
    from awslambdaric import __main__ as runtime_interface_client

    runtime_interface_client.main([sys.argv[0], handler])


if __name__ == "__main__":
    main()
EOF
cat >"$STAGE/lambda-entrypoint.sh" <<'EOF'
#!/bin/sh
# As the official base image's entry point: `docker run IMAGE module.handler`.
if [ $# -ne 1 ]; then
  echo "entrypoint requires the handler name to be the first argument" 1>&2
  exit 142
fi
export _HANDLER="$1"
RUNTIME_ENTRYPOINT=/var/runtime/bootstrap
if [ -z "${AWS_LAMBDA_RUNTIME_API}" ]; then
  exec /usr/local/bin/aws-lambda-rie $RUNTIME_ENTRYPOINT
else
  exec $RUNTIME_ENTRYPOINT
fi
EOF
chmod 755 "$STAGE/var/runtime/bootstrap" "$STAGE/lambda-entrypoint.sh"

if [ -z "${RIE:-}" ]; then
  for sam in "$(command -v sam 2>/dev/null || true)" "$PROJECT_DIR/.venv/bin/sam"; do
    [ -n "$sam" ] && [ -x "$sam" ] || continue
    sam_python=$(head -n1 "$sam" | sed 's/^#!//')
    candidate=$("$sam_python" -c 'import pathlib, samcli; print(pathlib.Path(samcli.__file__).parent / "local/rapid")' \
      2>/dev/null)/aws-lambda-rie-$ARCH || true
    if [ -f "$candidate" ]; then RIE=$candidate; break; fi
  done
fi
if [ -n "${RIE:-}" ] && [ -f "$RIE" ]; then
  install -D -m 755 "$RIE" "$STAGE/usr/local/bin/aws-lambda-rie"
else
  log "no aws-lambda-rie found: /lambda-entrypoint.sh needs one for plain docker run (SAM CLI brings its own)"
fi
step "bootstrap written"

# 5. Import as an image with the official image's configuration.
LD_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib
docker rmi -f "$IMAGE" >/dev/null 2>&1 || true
tar -C "$STAGE" --numeric-owner -cf - . | docker import --platform "linux/$DOCKER_ARCH" \
  --change "ENV LANG=C.UTF-8" \
  --change "ENV TZ=:/etc/localtime" \
  --change "ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin/:/bin:/opt/bin" \
  --change "ENV LD_LIBRARY_PATH=$LD_PATH" \
  --change "ENV LAMBDA_TASK_ROOT=/var/task" \
  --change "ENV LAMBDA_RUNTIME_DIR=/var/runtime" \
  --change "WORKDIR /var/task" \
  --change 'ENTRYPOINT ["/lambda-entrypoint.sh"]' \
  --message "local stand-in for the Lambda python3.13 base image ($PYTHON_SOURCE python, Debian $SUITE)" \
  - "$IMAGE" >/dev/null
# A daemon without multi-platform support ignores import's --platform and labels the image with its own
# architecture; `docker build --platform linux/<arch>` (what SAM runs) would then look for the base in a registry.
# So the architecture is set in the image's configuration: save, edit the config, load.
if [ "$(docker image inspect -f '{{.Architecture}}' "$IMAGE")" != "$DOCKER_ARCH" ]; then
  log "the daemon labelled the image $(docker image inspect -f '{{.Architecture}}' "$IMAGE"): setting $DOCKER_ARCH"
  relabel="$WORK_DIR/relabel-$ARCH"
  rm -rf "$relabel" && mkdir -p "$relabel"
  docker save "$IMAGE" | tar -C "$relabel" -xf -
  python3 - "$relabel" "$DOCKER_ARCH" <<'EOF'
import hashlib, json, os, sys
folder, arch = sys.argv[1], sys.argv[2]
manifest_path = os.path.join(folder, "manifest.json")
manifest = json.load(open(manifest_path))
for entry in manifest:
    config_path = os.path.join(folder, entry["Config"])
    config = json.load(open(config_path))
    config["architecture"] = arch
    config.pop("variant", None)
    data = json.dumps(config, separators=(",", ":")).encode()
    name = hashlib.sha256(data).hexdigest() + ".json"
    os.remove(config_path)
    with open(os.path.join(folder, name), "wb") as handle:
        handle.write(data)
    entry["Config"] = name
json.dump(manifest, open(manifest_path, "w"))
EOF
  docker rmi -f "$IMAGE" >/dev/null
  tar -C "$relabel" -cf - . | docker load >/dev/null
  rm -rf "$relabel"
  [ "$(docker image inspect -f '{{.Architecture}}' "$IMAGE")" = "$DOCKER_ARCH" ] || die "could not set the architecture"
fi
step "docker import"

# 6. Smoke test: the interpreter, the standard library's native modules, the runtime packages, the bootstrap's path.
docker run --rm --platform "linux/$DOCKER_ARCH" --entrypoint /var/lang/bin/python3.13 "$IMAGE" -c '
import platform, ssl, sqlite3, ctypes, lzma, bz2, zlib, hashlib, json, sys, uuid
sys.path.insert(0, "/var/runtime")
import bootstrap, awslambdaric, boto3, botocore, simplejson
path = bootstrap.lambda_sys_path(sys.path)
assert path[:3] == ["/var/task", "/opt/python/lib/python3.13/site-packages", "/opt/python"], path
print("python", platform.python_version(), platform.machine(), "| awslambdaric", awslambdaric.__version__,
      "| boto3", boto3.__version__, "| botocore", botocore.__version__, "|", ssl.OPENSSL_VERSION)
' || die "smoke test failed"
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
log "built $IMAGE: $((size / 1024 / 1024)) MiB, $(($(date +%s) - START)) s in all"
rm -rf "$STAGE"
