#!/usr/bin/env bash
# Issue 19's GPU run, in one command: `large` and `nano`, bf16, 10 steps, N in {1, 2, 4, 8}, eager
# (step_capture=off) against captured (step_capture=cuda_graph), one shared pipeline per config, CUDA peak memory,
# achieved TFLOP/s beside the chip's dense bf16 peak. About 5-6 minutes on one H200 (budget: under 8).
#
# Writes, in the repository (and copies to $OUT, which the device tool brings back):
#   bench/results/large_cuda-<gpu>_step-capture.{json,md,png}  (the suffix keeps the fp32/bf16 `large` run the
#                                                               README cites, large_cuda-nvidia-h200.*, in place)
#   bench/results/nano_cuda-<gpu>.{json,md,png}
#   $OUT/run.log                                               (everything printed)
#
# Runs on the device machine's own python3 (3.12, torch 2.11+cu130, transformers, matplotlib; no network). Only
# diffusers 0.42.1 is missing there and travels as a wheel in the ignored folder .whl. Once, in the root of the
# checkout the session's device tool sends (its own checkout, not a helper's worktree), with network here:
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       -d .whl diffusers==0.42.1
#
# Then ONE device call (leave time for a rerun inside the 15-minute budget; give_back afterwards):
#
#   run(command="bash bench/gpu/run.sh", carry=[".whl"], timeout_s=600)
#
# Copy the six result files from the reply's files_at into bench/results/ and commit them with the README's GPU
# section. Order inside: a 2-step tiny smoke run on CUDA first (about 30 s): if recording a CUDA graph fails there,
# the big runs measure eager only and the log says why, so one call still brings figures back.
#
# Dry run on any CPU (no GPU, no wheel needed when diffusers 0.42.1 is importable):
#   DRY_RUN=1 OUT=/tmp/gpu-dry bash bench/gpu/run.sh
# runs the same commands with --device cpu --config tiny, step_capture off,compile, 2 steps, 1 rep, into $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
started=$(date +%s)

if ! $PY -c 'import diffusers, sys; sys.exit(diffusers.__version__ != "0.42.1")' 2>/dev/null; then
    wheel=$(ls .whl/diffusers-0.42.1-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then
        echo "error: diffusers 0.42.1 is not importable and .whl/diffusers-0.42.1-*.whl is missing (see the header)"
        exit 2
    fi
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheel" \
        || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c 'import torch, diffusers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "diffusers", diffusers.__version__)'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv


if [ "${DRY_RUN:-0}" = 1 ]; then
    DEVICE=(--device cpu --dtype fp32) CONFIGS=(tiny tiny) MODES=off,compile COMMON=(--steps 2 --reps 1 --ns 1,2)
    RESULTS=$OUT/results SMOKE_MODES=off,compile TIMEOUTS=(1800 1800 1800)  # a CPU compiles slowly
else
    DEVICE=(--device cuda --dtype bf16) CONFIGS=(large nano) MODES=off,cuda_graph
    COMMON=(--steps 10 --reps 3 --ns 1,2,4,8) RESULTS=bench/results SMOKE_MODES=off,cuda_graph
    TIMEOUTS=(90 200 280)  # seconds: smoke, large, nano; together well inside the device tool's 600
fi

echo "== smoke: tiny, ${SMOKE_MODES}, 2 steps"
SMOKE=$(mktemp -d)  # not under $OUT: at most 8 files come back, and these are only a gate
if timeout "${TIMEOUTS[0]}" $PY -m trajectory_ensemble_node.cli bench --config tiny "${DEVICE[@]}" \
        --step-capture "$SMOKE_MODES" --ns 1,2 --steps 2 --reps 1 --work skip --memory skip --out "$SMOKE" \
        && $PY - "$SMOKE" <<'EOF'
import json, pathlib, sys
doc = json.loads(next(pathlib.Path(sys.argv[1]).glob("tiny_*.json")).read_text())
print("smoke: measured", doc["modes_measured"], "failed", doc["failed_modes"], "capture", doc["capture"])
# A replayed step must compute what the eager one does (a CUDA graph replays the same kernels: bitwise).
off_rule = [k for k, c in doc["cases"].items() if c.get("vs_eager") and not c["vs_eager"]["within_rule"]]
print("smoke: captured candidates outside the rule of eager:", off_rule or "none")
sys.exit(1 if doc["failed_modes"] or off_rule or len(doc["modes_measured"]) < 2 else 0)
EOF
then
    echo "smoke passed: measuring ${MODES}"
else
    echo "smoke FAILED (its output is above): the big runs measure eager only (off)"
    MODES=off
fi

status=0
measure() {  # measure CONFIG TIMEOUT [extra flags]: one serving run into $RESULTS
    local config=$1 limit=$2
    shift 2
    echo "== $config: $MODES (elapsed $(( $(date +%s) - started )) s)"
    timeout "$limit" $PY -m trajectory_ensemble_node.cli bench --config "$config" "${DEVICE[@]}" \
        --step-capture "$MODES" "${COMMON[@]}" --out "$RESULTS" "$@" || { echo "$config run failed (rc $?)"; status=1; }
}
measure "${CONFIGS[0]}" "${TIMEOUTS[1]}" --stem-suffix _step-capture
measure "${CONFIGS[1]}" "${TIMEOUTS[2]}"

for f in "$RESULTS"/"${CONFIGS[0]}"_*_step-capture.* "$RESULTS"/"${CONFIGS[1]}"_*.{json,md,png}; do
    [ -f "$f" ] && [ "$(dirname "$f")" != "$OUT" ] && cp "$f" "$OUT"/
done
echo "== done in $(( $(date +%s) - started )) s, status $status; files in $OUT:"
ls -la "$OUT"
exit $status
