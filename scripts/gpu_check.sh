#!/usr/bin/env bash
# gpu_check.sh: gputop against real NVIDIA GPUs, in one call, in under 8 minutes.
#
# LAST RUN ON REAL GPUS: never. This script has NOT YET RUN on a machine with NVIDIA GPUs. It was
# syntax-checked (bash -n) and its --no-cuda path (the same steps on the CPU, with gloo instead of
# NCCL and the simulated machine standing in for NVML) ran on a CPU-only box on 2026-12-01, also with
# --wheels (the offline install the lent H200 needs; every check passed in 1:18). Whoever
# first runs it on GPUs: replace these lines with the machine, the driver and the date, and commit the
# fixture and the figures it wrote.
#
# What it does, in order (each step is bounded by `timeout`; the whole run by about 8 minutes):
#   1. installs the project (pip install -e '.[test]'; torch with CUDA if torch is missing);
#   2. takes `gputop snapshot --json` into tests/fixtures/nvml/ (tests/test_snapshot_cli.py replays
#      every file there through the model) and prints what differs from the simulated H100 machine,
#      and compares gputop's topo -m matrix (its NIC rows come from sysfs) with `nvidia-smi topo -m`;
#   3. runs a real CUDA training job (tests/jobs/train_job.py --model conv --device cuda: a CNN on
#      images whose decode costs CPU) starved (num_workers=0), then tuned
#      (workers, pinned memory), takes `gputop report --pid` of each, and checks that the starved one
#      is called input-bound and the tuned one is not; while the tuned job runs, reads each GPU's PCIe
#      byte counters (NVML field values 197/198) and GetPcieThroughput side by side for 5 s, says whether
#      the counters are supported (and at what valueType: 32-bit ones wrap every 4 GiB) and prints how far
#      the two sources agree, beside the same figures from the simulated H100 machine;
#      and reads GPM (SM, tensor-core, DRAM activity; Hopper and newer) under the tuned job: supported or not,
#      the metrics' means and a sample's cost, beside the simulated H100 machine's;
#   4. hangs rank 1 of a 2-rank NCCL job and checks that the report's hang finding names that rank;
#   5. writes the reports and summary.json under benchmarks/gpu_check/HOST/ (commit them).
#
# Usage: scripts/gpu_check.sh [--no-cuda] [--skip-install | --wheels DIR] [--out DIR] [--seconds S]
#   --no-cuda       run every step on the CPU (simulated GPUs, gloo): checks the script, not the GPUs
#   --skip-install  use the gputop already importable (e.g. a checkout on PYTHONPATH)
#   --wheels DIR    a machine that reaches no package index: install the wheels in DIR into a folder of
#                   their own (no dependencies resolved, nothing fetched) and run gputop from this
#                   checkout; scripts/gpu_check_wheels.sh fills DIR, where pip can fetch
#   --out DIR       where the reports and figures go (default benchmarks/gpu_check/HOST, or a
#                   temporary directory with --no-cuda)
#   --seconds S     how long each report observes (default 25)
#
# On this workplace's lent machine (one H200; its image has torch, psutil, nvidia-ml-py, pytest and
# prometheus-client, not py-spy; nothing can be fetched there), prepare here, once, in the repo's root:
#     scripts/gpu_check_wheels.sh            # downloads into .whl/ (ignored by git) what the image lacks
# then make ONE device call, carrying .whl, with a timeout that leaves room to rerun:
#     bash scripts/gpu_check.sh --wheels .whl --out /tmp/gc --seconds 20; rc=$?;
#     tar czf "$OUT/gpu_check.tgz" -C /tmp/gc .; cp /tmp/gc/summary.json "$OUT/" 2>/dev/null; exit $rc
# and unpack what comes back: snapshot-real.json becomes tests/fixtures/nvml/<model>.json (the script
# prints the name), the rest goes under benchmarks/gpu_check/<host>/. Only $OUT comes back from that
# machine, at most 8 files: hence one archive. It has one GPU, so step 4 (two NCCL ranks) skips there.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
NO_CUDA=0
SKIP_INSTALL=0
WHEELS=""
OUT=""
SECONDS_PER_REPORT=25
while [ $# -gt 0 ]; do
    case "$1" in
        --no-cuda) NO_CUDA=1 ;;
        --skip-install) SKIP_INSTALL=1 ;;
        --wheels) WHEELS="${2:?--wheels needs a folder}"; shift ;;
        --out) OUT="$2"; shift ;;
        --seconds) SECONDS_PER_REPORT="$2"; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

HOST="$(hostname -s 2>/dev/null || hostname)"
if [ -z "$OUT" ]; then
    if [ "$NO_CUDA" = 1 ]; then OUT="$(mktemp -d -t gputop-gpu-check.XXXXXX)"; else OUT="$ROOT/benchmarks/gpu_check/$HOST"; fi
fi
mkdir -p "$OUT"
JOB="$ROOT/tests/jobs/train_job.py"
VERIFY="$ROOT/scripts/gpu_check_verify.py"
FAILED=0
STARTED_GROUPS=()

say() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; FAILED=$((FAILED + 1)); }

# Every job this script starts runs in its own session; on any exit, end those process groups (by the
# PIDs we started, nothing else).
cleanup() {
    local pgid
    for pgid in "${STARTED_GROUPS[@]:-}"; do
        [ -n "$pgid" ] && kill -KILL -- "-$pgid" 2>/dev/null || true
    done
}
trap cleanup EXIT

# start_job NAME ARGS...: run ARGS in a new session, PID in $JOB_PID
start_job() {
    local name="$1"; shift
    setsid "$@" >"$OUT/$name.out" 2>&1 < /dev/null &
    JOB_PID=$!
    STARTED_GROUPS+=("$JOB_PID")
}

# ready_count PREFIX: how many ranks wrote their ready record (PREFIX.PID, JSON) after their first step
ready_count() { find "$(dirname "$1")" -maxdepth 1 -name "$(basename "$1").*" ! -name '*.tmp' | wc -l; }

# rank_pid PREFIX RANK: the PID of that rank, from its ready record
rank_pid() {
    "$PYTHON" -c 'import glob, json, sys
records = [json.load(open(p)) for p in glob.glob(sys.argv[1] + ".[0-9]*") if not p.endswith(".tmp")]
print(next(r["pid"] for r in records if r["rank"] == int(sys.argv[2])))' "$1" "$2"
}

# wait_ready PREFIX COUNT SECONDS WHAT: a deadline on a condition (the ranks' first step), not a sleep
wait_ready() {
    local prefix="$1" count="$2" deadline=$((SECONDS + $3)) what="$4"
    while [ "$(ready_count "$prefix")" -lt "$count" ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then fail "timed out waiting for $what"; return 1; fi
        if ! kill -0 "$JOB_PID" 2>/dev/null; then fail "$what: the job exited (see $OUT/*.out)"; return 1; fi
        sleep 0.5
    done
}

stop_job() { kill -KILL -- "-$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# ---------------------------------------------------------------- 1. install
say "1. install"
if [ -n "$WHEELS" ]; then
    # offline: what the machine lacks goes to a folder of its own, gputop runs from this checkout, and
    # py-spy's program is put on PATH (gputop looks there)
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: no wheels in $WHEELS (run scripts/gpu_check_wheels.sh where pip can fetch)" >&2; exit 2; }
    SITE="$(mktemp -d -t gputop-site.XXXXXX)"
    timeout 300 "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    "$PYTHON" -c "import psutil, pynvml, torch" \
        || { echo "gpu_check.sh: this Python lacks psutil, nvidia-ml-py or torch; add their wheels to $WHEELS" >&2; exit 2; }
elif [ "$SKIP_INSTALL" = 0 ]; then
    if ! "$PYTHON" -c "import torch" 2>/dev/null; then
        if [ "$NO_CUDA" = 1 ]; then
            timeout 600 "$PYTHON" -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
        else
            timeout 600 "$PYTHON" -m pip install --quiet torch  # the CUDA build from PyPI
        fi
    fi
    timeout 600 "$PYTHON" -m pip install --quiet -e ".[test]"
fi
GPUTOP=("$PYTHON" -m gputop)
"${GPUTOP[@]}" --version
"$PYTHON" - <<'EOF'
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
EOF
if [ "$NO_CUDA" = 0 ]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv || true
    "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 1 else 1)" \
        || { echo "gpu_check.sh: torch sees no CUDA device; rerun with --no-cuda to check the script alone" >&2; exit 1; }
fi

# ---------------------------------------------------------------- 2. snapshot and differences
say "2. gputop snapshot --json"
"${GPUTOP[@]}" snapshot --simulate --json > "$OUT/snapshot-simulated.json"
if [ "$NO_CUDA" = 1 ]; then
    # no driver here: a second simulated machine stands in for the real one, so the comparison runs
    "${GPUTOP[@]}" snapshot --simulate rtx-4090-2 --json > "$OUT/snapshot-real.json"
    echo "(--no-cuda: compared a simulated RTX 4090 x2 with the simulated H100 x8; nothing written to tests/fixtures/nvml)"
else
    timeout 60 "${GPUTOP[@]}" snapshot --json > "$OUT/snapshot-real.json"
    MODEL="$("$PYTHON" -c "import json,re,sys; d=json.load(open(sys.argv[1])); m=d['machine']; print(re.sub(r'[^A-Za-z0-9]+','-', f\"{(m['gpu_names'] or ['none'])[0]}-x{m['gpu_count']}-driver-{m['driver_version']}\").strip('-').lower())" "$OUT/snapshot-real.json")"
    mkdir -p tests/fixtures/nvml
    cp "$OUT/snapshot-real.json" "tests/fixtures/nvml/$MODEL.json"
    echo "wrote tests/fixtures/nvml/$MODEL.json"
    timeout 120 "$PYTHON" -m pytest -q tests/test_snapshot_cli.py -k recorded_real_snapshot || fail "the real snapshot does not replay through the model"
    # the NIC rows and columns come from sysfs, not NVML: the first real check of where gputop places NICs
    if timeout 30 nvidia-smi topo -m > "$OUT/topo-m.txt" 2>&1; then
        echo "gputop's topo -m against nvidia-smi's:"
        "$PYTHON" "$VERIFY" topo-m "$OUT/snapshot-real.json" "$OUT/topo-m.txt" | tee "$OUT/topo-m-differences.txt" || true
    fi
fi
echo "what differs from the simulated machine:"
"$PYTHON" "$VERIFY" differences "$OUT/snapshot-real.json" "$OUT/snapshot-simulated.json" | tee "$OUT/differences.txt"

# ---------------------------------------------------------------- 3. starved, then tuned
DEVICE=cuda
CORES="$(nproc)"
TUNED_WORKERS=$(( CORES > 10 ? 8 : (CORES > 3 ? CORES - 2 : 1) ))
# the job: a CNN (3 hidden layers of 4096) on 128 images a batch, each image decoded in 1.5 ms of CPU
JOB_ARGS=(--model conv --device "$DEVICE" --layers 3 --width 4096 --batch-size 128 --sample-ms 1.5 --spend wall
          --persistent --prefetch-factor 4 --sync-every-step --max-seconds $((SECONDS_PER_REPORT + 150)))
TUNED_ARGS=()
if [ "$NO_CUDA" = 1 ]; then
    # On the CPU, with no driver: the verdicts rest on stacks and CPU alone (as on a box whose NVML is
    # broken). A small box cannot hide a heavy decode behind a CPU step with its few cores, so the tuned
    # run also decodes less: --no-cuda checks that the script works, not the GPUs.
    DEVICE=cpu
    JOB_ARGS=(--model conv --device cpu --layers 3 --width 256 --batch-size 16 --sample-ms 6 --spend wall
              --persistent --prefetch-factor 4 --sync-every-step --max-seconds $((SECONDS_PER_REPORT + 150)))
    TUNED_ARGS=(--sample-ms 0.5)
fi

pcie_check() {  # the PCIe byte counters against GetPcieThroughput, on this machine and on the simulated one
    say "3b. PCIe byte counters against GetPcieThroughput (while the tuned job runs)"
    local real_args=()
    # no driver with --no-cuda: the simulated RTX 4090s (no counters: the fallback) stand in for the real machine
    [ "$NO_CUDA" = 1 ] && real_args=(--simulate rtx-4090-2)
    timeout 60 "$PYTHON" "$VERIFY" pcie-measure "$OUT/pcie-real.json" ${real_args[@]+"${real_args[@]}"} \
        || { fail "reading the PCIe counters and GetPcieThroughput failed"; return; }
    timeout 60 "$PYTHON" "$VERIFY" pcie-measure "$OUT/pcie-simulated.json" --simulate h100-sxm-8 \
        || { fail "reading the simulated PCIe counters failed"; return; }
    "$PYTHON" "$VERIFY" pcie "$OUT/pcie-real.json" "$OUT/pcie-simulated.json" | tee "$OUT/pcie-differences.txt"
}

gpm_check() {  # GPM under the tuned job, on this machine and on the simulated one
    say "3c. GPM: supported or not, and the metrics under the tuned job (beside the simulated H100s)"
    local real_args=()
    [ "$NO_CUDA" = 1 ] && real_args=(--simulate rtx-4090-2)  # no driver: the simulated Ada cards (no GPM) stand in
    timeout 60 "$PYTHON" "$VERIFY" gpm-measure "$OUT/gpm-real.json" ${real_args[@]+"${real_args[@]}"} \
        || { fail "reading GPM failed"; return; }
    timeout 60 "$PYTHON" "$VERIFY" gpm-measure "$OUT/gpm-simulated.json" --simulate h100-sxm-8 \
        || { fail "reading the simulated GPM failed"; return; }
    "$PYTHON" "$VERIFY" gpm "$OUT/gpm-real.json" "$OUT/gpm-simulated.json" | tee "$OUT/gpm-differences.txt"
}

report_on() {  # report_on NAME PID: gputop report --pid PID as JSON into $OUT/NAME.json
    timeout $((SECONDS_PER_REPORT + 90)) "${GPUTOP[@]}" report --pid "$2" --seconds "$SECONDS_PER_REPORT" \
        --format json -o "$OUT/$1.json" || fail "gputop report on the $1 job failed"
}

for variant in starved tuned; do
    say "3. the $variant job"
    rm -f "$OUT/$variant.ready".*
    if [ "$variant" = starved ]; then
        start_job "$variant" "$PYTHON" "$JOB" "${JOB_ARGS[@]}" --workers 0 --ready "$OUT/$variant.ready"
    else
        start_job "$variant" "$PYTHON" "$JOB" "${JOB_ARGS[@]}" --workers "$TUNED_WORKERS" --pin-memory "${TUNED_ARGS[@]}" --ready "$OUT/$variant.ready"
    fi
    pid=$JOB_PID
    if wait_ready "$OUT/$variant.ready" 1 180 "the $variant job's first step"; then
        if [ "$variant" = tuned ]; then pcie_check; gpm_check; fi
        report_on "$variant" "$pid"
        [ -e "$OUT/$variant.json" ] && { "$PYTHON" "$VERIFY" verdict "$OUT/$variant.json" --expect "$variant" || fail "the $variant verdict"; }
    fi
    stop_job "$pid"
done

# ---------------------------------------------------------------- 4. one rank of two hangs
say "4. a 2-rank job whose rank 1 hangs"
if [ "$NO_CUDA" = 0 ] && [ "$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" -lt 2 ]; then
    echo "one GPU only: the NCCL hang needs two; skipped"
else
    rm -f "$OUT"/hang.ready.*
    # under torchrun the ranks all-reduce their gradients every step (NCCL on CUDA, gloo on the CPU)
    start_job hang "$PYTHON" -m torch.distributed.run --nproc-per-node 2 "$JOB" "${JOB_ARGS[@]}" \
        --workers 1 --hang-rank 1 --hang-rank-after-s 5 --ready "$OUT/hang.ready"
    launcher=$JOB_PID
    if wait_ready "$OUT/hang.ready" 2 240 "both ranks' first step"; then
        # torchrun starts each rank in a session of its own, out of reach of the launcher's group: end theirs too
        for record in "$OUT"/hang.ready.[0-9]*; do
            case "${record##*.}" in *[!0-9]*) ;; *) STARTED_GROUPS+=("${record##*.}") ;; esac
        done
        report_on hang "$launcher"
        [ -e "$OUT/hang.json" ] && { "$PYTHON" "$VERIFY" hang "$OUT/hang.json" --pid "$(rank_pid "$OUT/hang.ready" 1)" --rank 1 || fail "the hang finding"; }
    fi
    stop_job "$launcher"
    cleanup
fi

# ---------------------------------------------------------------- 5. figures
say "5. figures in $OUT"
"$PYTHON" "$VERIFY" figures "$OUT"
if [ "$FAILED" -gt 0 ]; then
    echo "gpu_check.sh: $FAILED check(s) failed; reports and job output are in $OUT" >&2
    exit 1
fi
echo "gpu_check.sh: every check passed; reports and figures are in $OUT"
