#!/usr/bin/env bash
# Builds Nereid's image (deploy/Dockerfile) with buildah, no daemon needed,
# then runs it and checks that it serves: every model of examples/models
# READY, the ONNX, Python and ensemble models answering over HTTP and gRPC
# (deploy/check_image.py). Exits non-zero when either fails.
#
#   bash deploy/build-image.sh [TAG]          default localhost/nereid:latest
#   LIBTORCH=1 bash deploy/build-image.sh     with the PyTorch backend (~1 GB more)
#   NO_RUN=1 bash deploy/build-image.sh       build only
#   NO_CACHE=1 bash deploy/build-image.sh     rebuild every layer (the build time recorded)
#   RUN_WITH=chroot bash deploy/build-image.sh   run under unshare + chroot, not podman
#   NO_BUILD=1 bash deploy/build-image.sh     only run and check the image TAG
#
# Installs buildah, podman, runc and debootstrap with apt when missing (as root).
# When the base image (debian:bookworm-slim) cannot be pulled, a stand-in is
# made with debootstrap (minbase bookworm, trimmed as Debian's slim images
# are) from the host's own Debian mirror, and tagged with the base's name.
# The container runs with podman (host network); where podman cannot run
# one, the image's root file system runs under unshare + chroot instead.
# The check runs on the host: it needs scripts/setup.sh's packages (python3-onnx
# makes examples/models, protoc and grpcio talk gRPC). Prints the image's size
# and the build time (docs/deploy.md records them).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/nereid:latest}
BASE=docker.io/library/debian:bookworm-slim
LIBTORCH=${LIBTORCH:-0}

need=""
for tool in buildah:buildah podman:podman runc:runc debootstrap:debootstrap; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need="$need ${tool#*:}"
done
if [ -n "$need" ]; then
  echo "build-image: installing$need"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need crun >/dev/null
fi

standin_base() {
  local mirror root ctr
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
  echo "build-image: $BASE cannot be pulled; making it with debootstrap from $mirror"
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
  # as Debian's slim images: no documentation, manual pages or translations
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  find "$root/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/groff/* "$root"/usr/share/lintian/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  # the host's apt sources (same suites and snapshot as the host's packages)
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    rm -f "$root/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
  fi
  # and as their apt configuration: no downloaded packages kept
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/*
  ctr=$(buildah from scratch)
  cp -a "$root"/. "$(buildah mount "$ctr")"/
  buildah umount "$ctr" >/dev/null
  buildah config --cmd /bin/bash "$ctr"
  buildah commit -q "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
  rm -rf "$root"
}

if [ "${NO_BUILD:-0}" != 1 ] && ! buildah inspect --type image "$BASE" >/dev/null 2>&1 \
   && ! timeout 120 buildah pull -q "$BASE" >/dev/null 2>&1; then
  standin_base
fi

# The host's CA bundle reaches the ONNX Runtime download as a build secret
# (a network that inspects TLS has a CA of its own); the image keeps nothing.
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
secret=()
[ -s "$CA_BUNDLE" ] && secret=(--secret "id=cacert,src=$CA_BUNDLE")
cache=(--layers)
[ "${NO_CACHE:-0}" = 1 ] && cache=(--layers --no-cache)
start=$(date +%s)
[ "${NO_BUILD:-0}" = 1 ] || nice -n 19 buildah bud "${cache[@]}" --isolation chroot --pull=false "${secret[@]}" \
  --build-arg "BASE=$BASE" --build-arg "LIBTORCH=$LIBTORCH" -f deploy/Dockerfile -t "$TAG" .
secs=$(( $(date +%s) - start ))
size=$(podman image inspect --format '{{.Size}}' "$TAG")
[ "${NO_BUILD:-0}" = 1 ] || echo "build-image: $TAG built in ${secs} s, $(( size / 1000000 )) MB (LIBTORCH=$LIBTORCH)"
[ "${NO_RUN:-0}" = 1 ] && exit 0

# --- run the image on examples/models and check it answers -----------------
[ -f examples/models/add_sub_onnx/1/model.onnx ] || /usr/bin/python3 scripts/make_models.py examples/models
ports=($(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])'))
args=(--model-repository=/models --http-address=127.0.0.1 --http-port="${ports[0]}"
      --grpc-address=127.0.0.1 --grpc-port="${ports[1]}" --metrics-port="${ports[2]}")
name=nereid-image-check-$$
log=$(mktemp)
cleanup=()
trap 'for c in "${cleanup[@]}"; do eval "$c" || true; done; rm -f "$log"' EXIT

# podman as it is; else with runc and limits the process may set (a sandbox
# without CAP_SYS_RESOURCE, or with hybrid cgroups that crun refuses).
podman_ok=0
# each variant: "podman options|run options"
variants=("|" "--runtime runc|--ulimit nofile=$(ulimit -Hn):$(ulimit -Hn) --ulimit nproc=4096:4096")
[ "${RUN_WITH:-podman}" = chroot ] && variants=()   # RUN_WITH=chroot: no podman
for v in "${variants[@]}"; do
  popts=${v%%|*} ropts=${v#*|}
  [[ "$popts" == *runc* ]] && ! command -v runc >/dev/null && continue
  # shellcheck disable=SC2086
  if podman $popts run $ropts -d --name "$name" --network host --shm-size=256m \
       -v "$PWD/examples/models:/models:ro" "$TAG" "${args[@]}" >/dev/null 2>"$log"; then
    podman_ok=1
    break
  fi
  podman rm -f "$name" >/dev/null 2>&1 || true
done
if [ "$podman_ok" = 1 ]; then
  cleanup+=("podman rm -f -t 5 $name >/dev/null 2>&1")
  how="podman${popts:+ $popts}${ropts:+ $ropts}"
  logs() { podman logs "$name" 2>&1 | tail -40; }
  alive() { [ "$(podman inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; }
else
  if [ "${RUN_WITH:-podman}" = chroot ]; then echo "build-image: RUN_WITH=chroot: using unshare + chroot"
  else echo "build-image: podman cannot run the container ($(tail -1 "$log")); using unshare + chroot"; fi
  ctr=$(buildah from --pull=false "$TAG")
  cleanup+=("buildah rm $ctr >/dev/null")
  root=$(buildah mount "$ctr")
  mkdir -p "$root/models"
  unshare --mount --pid --fork --mount-proc="$root/proc" sh -c '
    root=$1; shift
    mount --bind "$PWD/examples/models" "$root/models" && mount -o remount,bind,ro "$root/models"
    mount --rbind /dev "$root/dev" && mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
    mount -t tmpfs tmpfs "$root/tmp"
    exec chroot --userspec=10001:10001 "$root" /opt/nereid/bin/nereid "$@"' sh "$root" "${args[@]}" \
    >"$log" 2>&1 &
  pid=$!
  # unshare waits for its child and ignores SIGTERM: stop nereid itself
  cleanup=("kill \$(pgrep -P $pid) 2>/dev/null; wait $pid" "${cleanup[@]}")
  how="unshare + chroot"
  logs() { tail -40 "$log"; }
  alive() { kill -0 "$pid" 2>/dev/null; }
fi
echo "build-image: running $TAG ($how), HTTP ${ports[0]}, gRPC ${ports[1]}"
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:${ports[0]}/v2/health/ready" >/dev/null && break
  alive || break
  sleep 1
done
if ! NEREID_MODELS=examples/models /usr/bin/python3 deploy/check_image.py "${ports[0]}" "${ports[1]}"; then
  echo "build-image: $TAG does not serve examples/models; its log:" >&2
  logs >&2
  exit 1
fi
echo "build-image: $TAG serves examples/models over HTTP and gRPC"
