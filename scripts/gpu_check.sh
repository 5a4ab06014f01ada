#!/usr/bin/env bash
# GPU check (issue 9): one command, well under 8 minutes on a CUDA machine. It runs the
# quickstart's recipe for a few RL steps in bf16 on the GPU with the hf engine and, where
# vLLM imports (in this Python or in .venv-vllm), with the vllm engine. It prints one row per
# engine: median step time, rollout tokens/s, median weight-sync seconds, and the peak GPU
# memory that nvidia-smi saw during the run (every process on the GPU together).
#
# On a machine without CUDA it says so and exits 0. It installs nothing: run it where
# `.venv` (or $PYTHON) has a CUDA build of torch, e.g. after `pip install torch==2.13.0`
# from PyPI's default index and `pip install -e .`.
#
#   bash scripts/gpu_check.sh            # STEPS=8 by default
#   STEPS=20 PYTHON=/path/to/python bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
STEPS=${STEPS:-8}
PER_RUN_TIMEOUT_S=${PER_RUN_TIMEOUT_S:-200}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu DTYPE=float32 runs the same script here (no GPU memory column)
DTYPE=${DTYPE:-bfloat16}

if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to $PYTHON (torch.cuda.is_available() is False, or no torch); nothing to check"
    exit 0
fi
[ "$DEVICE" = cuda ] && "$PYTHON" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

work=$(mktemp -d /tmp/rlpipe-gpu-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

engines=(hf)
if "$PYTHON" -c "import vllm" 2>/dev/null || [ -x .venv-vllm/bin/python ]; then
    engines+=(vllm)
else
    echo "gpu_check: vllm imports neither in $PYTHON nor in .venv-vllm: the vllm row is skipped"
fi

peak_memory_mib() {  # polls nvidia-smi every 0.5 s until killed; prints the peak on exit
    local peak=0 used
    trap 'echo "$peak"; exit 0' TERM
    while true; do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | awk '{s += $1} END {print s + 0}')
        [ "${used:-0}" -gt "$peak" ] && peak=$used
        sleep 0.5
    done
}

printf '\n%-6s %12s %12s %12s %16s %s\n' engine step_s tokens_per_s sync_s peak_gpu_mib result
for engine in "${engines[@]}"; do
    lake="$work/lake-$engine"
    peak_memory_mib > "$work/peak-$engine" &
    sampler=$!
    started=$SECONDS
    timeout "$PER_RUN_TIMEOUT_S" "$PYTHON" -m rlpipe.cli.main train configs/quickstart.toml --run-id "gpu-$engine" \
        --set model.device=\""$DEVICE"\" --set model.dtype=\""$DTYPE"\" --set rollout.engine=\""$engine"\" \
        --set train.steps="$STEPS" --set checkpoint.every_steps="$STEPS" \
        --set storage.lake_uri=\""$lake"\" --set tracking.mlflow_uri=\""sqlite:///$work/mlflow-$engine.db"\" \
        > "$work/run-$engine.log" 2>&1
    code=$?
    kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    if [ "$code" -ne 0 ]; then
        printf '%-6s %12s %12s %12s %16s %s\n' "$engine" - - - "$(cat "$work/peak-$engine")" "failed (exit $code after $((SECONDS - started)) s); last lines:"
        tail -n 15 "$work/run-$engine.log"
        continue
    fi
    row=$("$PYTHON" -m rlpipe.cli.main query --lake "$lake" --json \
        "select median(time_step_s) as step_s, sum(rollout_tokens) / sum(time_generate_s) as tokens_per_s,
                median(sync_seconds) as sync_s from step_metrics" \
        | "$PYTHON" -c "import json, sys; r = json.load(sys.stdin)[0]; print(f\"{r['step_s']:.3f} {r['tokens_per_s']:.0f} {r['sync_s']:.4f}\")")
    read -r step_s tokens_per_s sync_s <<< "$row"
    printf '%-6s %12s %12s %12s %16s %s\n' "$engine" "$step_s" "$tokens_per_s" "$sync_s" "$(cat "$work/peak-$engine")" \
        "ok ($STEPS steps, $((SECONDS - started)) s with warm-start and evaluations)"
done
