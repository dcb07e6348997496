#!/usr/bin/env bash
# The one command that trains the embedded default model on a GPU machine.
#
# Builds the corpus from that machine's own installed Python source, trains the tokenizer, trains the
# `gpu` preset (bf16 autocast, torch.compile) to a wall-clock budget and packs the model folder into
# $OUT as a tar split into 15 MB parts (the device tool returns at most 8 files of 16 MiB), beside
# the model card and the console log. Corpus and tokenizer take about 2 minutes there, training 5
# (the issue allows up to 8: raise GLM5_BUDGET_MINUTES once the prep time is known), evaluation and
# saving about 1: the whole command stays inside the device tool's 10-minute limit.
#
# Here, once (writes the HumanEval fingerprints, since ../shared does not travel to that machine):
#     scripts/gpu_train.sh --prepare
# On the GPU machine (device tool: command "bash scripts/gpu_train.sh", carry [".gpu"], timeout 600):
#     bash scripts/gpu_train.sh
# Back here, unpack into the package (replacing the CPU stop-gap):
#     rm -rf glm5_lsp/weights/glm5-code-tiny && mkdir -p glm5_lsp/weights/glm5-code-tiny
#     cat FILES_AT/glm5-code-gpu.tar.part-* | tar -xf - -C glm5_lsp/weights/glm5-code-tiny --strip-components=1
# then measure HumanEval with the harness and add the figures to the model card:
#     glm5-lsp eval humaneval --data ../shared/benchmarks/humaneval/HumanEval.jsonl.gz --out runs/eval/he
#     glm5-lsp train --out glm5_lsp/weights/glm5-code-tiny --add-eval runs/eval/he/report.json
#
# Knobs (environment): GLM5_BUDGET_MINUTES (training budget, default 5), GLM5_COMPILE (1/0, default 1),
# GLM5_MAX_TRAIN_BYTES (corpus cap, default 120000000), GLM5_GUARD (guard file, default .gpu/benchmark_guard.json).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
GUARD="${GLM5_GUARD:-.gpu/benchmark_guard.json}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p "$(dirname "$GUARD")"
    if [[ -d .git ]] && ! grep -qx '/.gpu/' .git/info/exclude 2>/dev/null; then echo '/.gpu/' >> .git/info/exclude; fi
    exec "$PY" -m glm5_lsp.cli train --write-guard "$GUARD"
fi

if [[ ! -f "$GUARD" ]]; then
    echo "gpu_train.sh: no benchmark guard at $GUARD; run 'scripts/gpu_train.sh --prepare' where ../shared/benchmarks exists and carry .gpu" >&2
    exit 2
fi
"$PY" -c "import torch, tokenizers, safetensors, numpy, matplotlib; assert torch.cuda.is_available(), 'no CUDA device'" \
    || { echo "gpu_train.sh: this machine lacks torch with CUDA, tokenizers, safetensors, numpy or matplotlib" >&2; exit 3; }

OUT="${OUT:-$ROOT/runs/gpu}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
MODEL="$WORK/glm5-code-gpu"
COMPILE=--compile
[[ "${GLM5_COMPILE:-1}" == "0" ]] && COMPILE=--no-compile
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/train_console.log"

"$PY" -m glm5_lsp.cli train -v \
    --out "$MODEL" --preset gpu --device cuda "$COMPILE" \
    --budget-minutes "${GLM5_BUDGET_MINUTES:-5}" \
    --max-train-bytes "${GLM5_MAX_TRAIN_BYTES:-120000000}" \
    --guard-file "$GUARD" --workers "$(nproc)" --name glm5-code-tiny 2>&1 | tee -a "$OUT/train_console.log"

cp "$MODEL/MODEL_CARD.md" "$OUT/MODEL_CARD.md"
tar -C "$WORK" -cf - glm5-code-gpu | split -b 15m -d - "$OUT/glm5-code-gpu.tar.part-"
ls -l "$OUT"
