#!/usr/bin/env bash
# Does meshdl install and run on a Raspberry Pi's CPU? Checked from an amd64 Debian machine.
#
#   deploy/arm/check-arm.sh --quick   wheels of numba, llvmlite, numpy for aarch64 and armv7l on
#                                     the package index pip is configured with
#   deploy/arm/check-arm.sh           the same for every runtime dependency, then a node host in
#                                     an emulated arm64 Debian (qemu-user-static + debootstrap)
#                                     trains a 3 x 3 mesh with an edge on this machine
#
# One line per step on stdout. Exit 0: everything checked passed; 1: a check failed (an
# aarch64 wheel missing, the emulated install or run failed); 2: could not check (index
# unreachable, no emulator, not root for the emulated part). armv7l (32-bit Raspberry Pi
# OS) is reported, never a failure: PyPI has no armv7l wheels of numba, llvmlite or numpy.
#
# Package indexes: the ones this machine is configured with. pip asks its own index
# (pip config, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL); ARM_INDEX_URL replaces it for this check
# only. debootstrap uses ARM_MIRROR when set, else its own default mirror.
#
# Needs: the repository's .venv (its pip asks the index; its meshdl runs the broker and the
# edge), mosquitto; for the emulated part root and
#   apt-get install -y --no-install-recommends qemu-user-static debootstrap binfmt-support
# Scratch data (wheels, the arm64 root file system, run directories) goes to $ARM_WORK
# (default /tmp/arm), never into the repository; a second run reuses the root file system.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${ARM_WORK:-/tmp/arm}
VENV=${MESHDL_VENV:-$REPO/.venv}
SUITE=${ARM_SUITE:-bookworm}
MIRROR=${ARM_MIRROR:-}   # empty: debootstrap's own default mirror
INDEX_URL=${ARM_INDEX_URL:-}   # empty: pip's configured index
GLIBC_MINOR=${ARM_GLIBC_MINOR:-36}   # Debian 12 / Raspberry Pi OS bookworm: glibc 2.36
PORT=${ARM_PORT:-}   # default: a free port
ROOTFS=$WORK/rootfs-arm64
QUICK=0
FAILED=0
SKIPPED=0

say() { printf '%-9s %s\n' "$1" "$2"; }
fail() { say "$1" "FAIL: $2"; FAILED=1; }
skip() { say "$1" "SKIP: $2"; SKIPPED=1; }

usage() {
    # The header comment, however long it grows: up to the first line that is not one.
    awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# The runtime dependency closure of meshdl as installed in the venv, pinned (name==version).
pinned_closure() {
    "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
from packaging.requirements import Requirement

seen, todo = {}, ["meshdl"]
while todo:
    for text in md.distribution(todo.pop()).requires or []:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key not in seen:
            seen[key] = md.version(req.name)
            todo.append(req.name)
print("\n".join(f"{k}=={v}" for k, v in sorted(seen.items())))
EOF
}

# pip's --platform is taken literally (pip 23 does not widen manylinux_2_36 to older
# tags), so name every tag a wheel for this glibc may carry.
platform_args() {
    local arch=$1 minor
    for ((minor = GLIBC_MINOR; minor >= 17; minor--)); do
        printf -- '--platform manylinux_2_%d_%s ' "$minor" "$arch"
    done
    printf -- '--platform manylinux2014_%s --platform linux_%s' "$arch" "$arch"
}

# pip as this machine configures it, with two exceptions for the check: a local wheel
# directory (find-links) is not something a Pi installs from, and a site constraint file
# could contradict the exact pins this check asks for. Usage: index_pip SECONDS COMMAND ARGS...
index_pip() {
    local seconds=$1 command=$2 index=()
    shift 2
    [[ -n $INDEX_URL ]] && index=(--index-url "$INDEX_URL")
    PIP_FIND_LINKS= PIP_CONSTRAINT= timeout "$seconds" "$VENV/bin/pip" "$command" \
        --disable-pip-version-check "${index[@]}" "$@"
}

# A URL as it may be printed: a login in it (user:password@) is not.
redact_url() {
    sed -E 's#^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@#\1****@#' <<<"$1"
}

# pip's configured value of an option, from the environment or pip config ("" if unset),
# with where it came from: "PIP_INDEX_URL=..." or "pip config global.index-url=...".
pip_setting() {
    local option=$1 env_name line
    env_name=PIP_$(tr 'a-z-' 'A-Z_' <<<"$option")
    if [[ -n ${!env_name:-} ]]; then
        echo "$env_name=$(redact_url "${!env_name}")"
    # Not piped straight into grep -m 1: under pipefail pip's SIGPIPE would fail the match.
    elif line=$("$VENV/bin/pip" config list 2>/dev/null) &&
        line=$(grep -m 1 -E "^[a-z]+\.$option=" <<<"$line"); then
        echo "pip config ${line%%=*}=$(redact_url "$(tr -d "'\"" <<<"${line#*=}")")"
    fi
}

# Which settings name the indexes pip asks, for the lines a user reads.
index_origin() {
    local main extra
    if [[ -n $INDEX_URL ]]; then
        main="ARM_INDEX_URL=$(redact_url "$INDEX_URL")"
    else
        main=$(pip_setting index-url)
        main=${main:-"pip's default index: no ARM_INDEX_URL, PIP_INDEX_URL or pip config index-url"}
    fi
    extra=$(pip_setting extra-index-url)
    echo "$main${extra:+; extra indexes: $extra}"
}

# Download one pinned package's wheel for an arch; prints the wheel's file name.
wheel_for() {
    local arch=$1 spec=$2 dest=$WORK/wheels/$1 out
    mkdir -p "$dest"
    # shellcheck disable=SC2046  # the platform arguments are meant to split
    out=$(index_pip 300 download --no-deps --only-binary=:all: --python-version 311 \
        --implementation cp --abi cp311 --abi abi3 --abi none $(platform_args "$arch") \
        -d "$dest" "$spec" 2>&1) || return 1
    grep -oE '[^/ ]+\.whl' <<<"$out" | tail -n 1
}

# Reachable means: pip itself, asking the configured index, lists numba. pip says why an
# index failed only at -vv ("Could not fetch URL ...: connection error ..."); that reason
# ends the line, so a wrong proxy or mirror is told apart from a missing package.
check_index() {
    local out reason origin
    origin=$(index_origin)
    if out=$(index_pip 120 index versions numba --retries 1 --timeout 15 -vv 2>&1); then
        say index "ok: reachable, lists numba ($origin)"
        return 0
    fi
    reason=$(grep -m 1 -oE 'Could not fetch URL [^ ]+: [a-zA-Z ]*[a-zA-Z]' <<<"$out")
    [[ -n $reason ]] && reason+=$(grep -m 1 -oE "\[Errno -?[0-9]+\] [^')\"]*" <<<"$out" |
        sed 's/^/ /')
    skip index "unreachable: pip finds no numba at the index ($origin)${reason:+; $reason}"
    return 1
}

# One line per arch: how many of the packages install from wheels, and which would be built
# from source (numba, llvmlite and numpy have compiled parts; llvmlite's build needs LLVM).
check_wheels() {
    local arch=$1 specs=$2 spec whl ok=0 total=0 compiled=() missing=()
    for spec in $specs; do
        total=$((total + 1))
        if whl=$(wheel_for "$arch" "$spec"); then
            ok=$((ok + 1))
            [[ $whl == *-none-any.whl ]] || compiled+=("${spec}")
        else
            missing+=("$spec")
        fi
    done
    local line="$ok/$total from wheels on the index"
    ((${#compiled[@]})) && line+="; binary: ${compiled[*]}"
    if ((${#missing[@]})); then
        line+="; NO WHEEL (pip would build from source): ${missing[*]}"
        if [[ $arch == aarch64 ]]; then
            fail "wheels" "$arch $line"
        else
            say "wheels" "info: $arch $line"
        fi
    else
        say "wheels" "ok: $arch $line"
    fi
}

check_emulator() {
    if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
        skip emulator "qemu-aarch64-static or debootstrap missing (apt-get install -y --no-install-recommends qemu-user-static debootstrap binfmt-support)"
        return 1
    fi
    if ((EUID != 0)); then
        skip emulator "debootstrap and chroot need root"
        return 1
    fi
    if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null
    fi
    if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && command -v update-binfmts >/dev/null; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1
    fi
    # F (fix binary): the kernel opens qemu when it is registered, so a chroot needs no copy.
    if ! grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null ||
        ! grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
        skip emulator "binfmt_misc has no enabled qemu-aarch64 entry with flag F (container without binfmt_misc?)"
        return 1
    fi
    say emulator "ok: $(qemu-aarch64-static --version | head -n 1), binfmt qemu-aarch64 enabled"
}

# A machine behind a TLS-inspecting proxy trusts the proxy's CA through PIP_CERT (or
# ARM_CA_BUNDLE); the fresh root file system does not, so its pip gets a copy of that bundle.
CA_BUNDLE=${ARM_CA_BUNDLE:-${PIP_CERT:-}}
ROOTFS_ENV=(HOME=/root PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8)

in_rootfs() {
    chroot "$ROOTFS" /usr/bin/env -i "${ROOTFS_ENV[@]}" "$@"
}

make_rootfs() {
    local start=$SECONDS
    if [[ -e $ROOTFS/.meshdl-rootfs-ok ]]; then
        say rootfs "ok: reused $ROOTFS"
        return 0
    fi
    rm -rf "$ROOTFS"
    local mirror=()
    [[ -n $MIRROR ]] && mirror=("$MIRROR")
    if ! debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,ca-certificates "$SUITE" "$ROOTFS" "${mirror[@]}" \
        >"$WORK/debootstrap.log" 2>&1; then
        fail rootfs "debootstrap failed, see $WORK/debootstrap.log"
        return 1
    fi
    touch "$ROOTFS/.meshdl-rootfs-ok"
    say rootfs "ok: debootstrap arm64 $SUITE in $((SECONDS - start)) s"
}

# pip inside the chroot needs name resolution and /proc (numba reads the CPU from it).
mount_rootfs() {
    cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
    if [[ -n $CA_BUNDLE && -r $CA_BUNDLE ]]; then
        cp -L "$CA_BUNDLE" "$ROOTFS/etc/ssl/host-ca-bundle.crt"
        ROOTFS_ENV+=(PIP_CERT=/etc/ssl/host-ca-bundle.crt)
    fi
    mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
    trap 'umount "$ROOTFS/proc" 2>/dev/null; stop_background' EXIT
}

# The committed tree (git archive HEAD), as a clone on the Pi would have it.
install_meshdl() {
    local start=$SECONDS
    rm -rf "$ROOTFS/opt/meshdl" && mkdir -p "$ROOTFS/opt/meshdl"
    git -C "$REPO" archive HEAD | tar -x -C "$ROOTFS/opt/meshdl"
    if [[ ! -x $ROOTFS/opt/venv/bin/python ]]; then
        in_rootfs python3 -m venv /opt/venv || { fail install "python3 -m venv failed"; return 1; }
    fi
    if ! in_rootfs /opt/venv/bin/pip install --disable-pip-version-check --only-binary=:all: \
        /opt/meshdl >"$WORK/pip-arm64.log" 2>&1; then
        fail install "pip install (wheels only) failed, see $WORK/pip-arm64.log"
        return 1
    fi
    say install "ok: pip install . from wheels only in $((SECONDS - start)) s ($(
        in_rootfs /opt/venv/bin/python -c 'import platform, numba, llvmlite, numpy
print(platform.machine(), "numba", numba.__version__, "llvmlite", llvmlite.__version__,
      "numpy", numpy.__version__)'))"
}

BACKGROUND=()
stop_background() {
    local pid
    for pid in "${BACKGROUND[@]}"; do kill "$pid" 2>/dev/null; done
    BACKGROUND=()
}

# A 3 x 3 mesh (the smallest the default 3 x 3 kernel fits), 40 samples, batch 10, 1 epoch.
make_run_files() {
    local dir=$1
    mkdir -p "$dir" && rm -rf "$dir"/runs
    [[ -e $dir/mesh.toml ]] || {
        "$VENV/bin/meshdl" config init "$dir/mesh.toml" --rows 3 --cols 3 >/dev/null 2>&1 &&
            sed -i 's/^epochs = .*/epochs = 1/; s/^batch = .*/batch = 10/' "$dir/mesh.toml"
    }
    [[ -e $dir/d.npz ]] || "$VENV/bin/meshdl" data generate --config "$dir/mesh.toml" \
        --train 40 --test 10 --out "$dir/d.npz" >/dev/null 2>&1
}

# Train once: the node host is "$@ meshdl nodes run ..." (a command prefix that ends in exec
# chains, so $! is the node host), the edge runs here; sets T_RUN to the edge's wall time.
T_RUN=
train_once() {
    local label=$1 dir=$2 nodes_dir=$3 start nodes rc=0
    shift 3
    "$@" meshdl nodes run --cells 0-2,0-2 --broker "mqtt://127.0.0.1:$PORT" \
        --mesh "$nodes_dir/mesh.toml" --data "$nodes_dir/d.npz" >"$WORK/nodes-$label.log" 2>&1 &
    nodes=$!
    start=$EPOCHREALTIME
    "$VENV/bin/meshdl" edge run --broker "mqtt://127.0.0.1:$PORT" --mesh "$dir/mesh.toml" \
        --data "$dir/d.npz" --out "$dir/runs/$label" --nodes-timeout 900 \
        >"$WORK/edge-$label.log" 2>&1 || rc=1
    T_RUN=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    kill "$nodes" 2>/dev/null
    wait "$nodes" 2>/dev/null
    return $rc
}

# Same parameters? Prints "identical bytes" or how many float values differ and by how much;
# fails beyond 1e-4 (rounding differs between CPUs, a wrong exchange does not look like that).
same_model() {
    "$VENV/bin/python" - "$1" "$2" <<'EOF'
import sys

import numpy as np

a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
if sorted(a.files) != sorted(b.files):
    print("different parameter names")
    sys.exit(1)
floats = [k for k in a.files if a[k].dtype.kind == "f"]
if any(not np.array_equal(a[k], b[k]) for k in a.files if k not in floats):
    print("different non-numeric entries (config?)")
    sys.exit(1)
diff = {k: np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)) for k in floats}
worst = max(float(d.max()) for d in diff.values())
if worst == 0:
    print("identical bytes")
    sys.exit(0)
changed = sum(int((d > 0).sum()) for d in diff.values())
total = sum(d.size for d in diff.values())
print(f"{changed} of {total} weights differ, by at most {worst:.2g} (float32 rounding)")
sys.exit(0 if worst < 1e-4 else 1)
EOF
}

run_mesh() {
    local host=$WORK/run arm=$ROOTFS/tmp/meshdl-run t_amd t_arm verdict
    make_run_files "$host" || { fail mesh "could not write mesh.toml / d.npz"; return 1; }
    mkdir -p "$arm" && cp "$host/mesh.toml" "$host/d.npz" "$arm/"
    [[ -n $PORT ]] || PORT=$("$VENV/bin/python" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$VENV/bin/meshdl" broker --port "$PORT" >"$WORK/broker.log" 2>&1 &
    BACKGROUND+=($!)
    sleep 2
    if ! kill -0 "${BACKGROUND[-1]}" 2>/dev/null; then
        fail mesh "the broker did not start on port $PORT, see $WORK/broker.log"
        return 1
    fi
    if ! train_once amd64 "$host" "$host" env PATH="$VENV/bin:$PATH"; then
        fail mesh "amd64 reference run failed, see $WORK/edge-amd64.log"
        return 1
    fi
    t_amd=$T_RUN
    # chroot execs env execs python: $! is the node host itself, so it can be stopped.
    if ! train_once arm64 "$host" /tmp/meshdl-run chroot "$ROOTFS" /usr/bin/env -i \
        "${ROOTFS_ENV[@]}" /opt/venv/bin/python -m; then
        fail mesh "arm64 node host run failed, see $WORK/nodes-arm64.log and $WORK/edge-arm64.log"
        return 1
    fi
    t_arm=$T_RUN
    if ! verdict=$(same_model "$host/runs/amd64/model.npz" "$host/runs/arm64/model.npz"); then
        fail mesh "arm64 node host trained another model than amd64: $verdict"
        return 1
    fi
    say mesh "ok: 3 x 3 mesh, 1 epoch; edge wall time ${t_arm} s with the arm64 node host (emulated), ${t_amd} s with amd64; models: $verdict"
}

main() {
    case ${1:-} in
        --quick) QUICK=1 ;;
        "") ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    mkdir -p "$WORK"
    [[ -x $VENV/bin/pip ]] || { skip venv "no $VENV (run ./bootstrap)"; exit 2; }
    local specs
    if check_index; then
        specs=$(pinned_closure)
        ((QUICK)) && specs=$(grep -E '^(numba|llvmlite|numpy)==' <<<"$specs")
        check_wheels aarch64 "$specs"
        check_wheels armv7l "$specs"
    fi
    if ((!QUICK)) && check_emulator && make_rootfs; then
        mount_rootfs
        install_meshdl && run_mesh
        stop_background
    fi
    ((FAILED)) && exit 1
    ((SKIPPED)) && exit 2
    exit 0
}

# Sourced (by tests/test_arm_check.py) it only defines the functions.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
