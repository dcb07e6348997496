#!/usr/bin/env bash
# The whole promotion of the continued CPU run, in one command: what a session runs before it ends
# (runs/ does not outlive this machine, so weights not promoted are lost with it).
#
#   scripts/promote.sh            promote, then refit what depends on the weights
#   scripts/promote.sh --refit    only the refits, for the weights already in the package
#
# 1. scripts/cpu_train.sh --promote: stop the run, compare held-out perplexity with the shipped weights,
#    write them into the package when better (with HumanEval and single-line infilling on the model
#    card), start the run again. Not better: nothing else is done.
# 2. The memory's interpolation table and level gate refitted for them (glm5_lsp/memory/interpolation.json).
# 3. The gate's rows collected again (cursors in a word, after a space, and block requests,
#    one after the other) and the gate trained into the weights' gate/ folder.
# 4. completion.minQuality's default in the VS Code extension and the README set to the new gate's
#    threshold.
# 5. What a user would see change: the FIT packages' cursors through the language server, this
#    working tree (the new weights, table and gate) against the last commit, asked alternately
#    (benchmarks/lines.py --baseline): held-out perplexity decides the promotion, this says what it
#    does to the answers (exact, right word, precision) before it is committed. GLM5_PROMOTE_AB=0
#    skips it (about 10 minutes).
#
# Every step reads BENCHMARK_FIT packages only (glm5_lsp.train.corpus): the REPORT ones stay unseen.
# The rows and logs stay in GLM5_REFIT (default runs/refit). Commit what changed under glm5_lsp/ and
# extension/, with the figures the steps printed, then re-measure on REPORT (BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${GLM5_REFIT:-runs/refit}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

if [[ "${1:-}" != "--refit" ]]; then
    code=0
    scripts/cpu_train.sh --promote || code=$?
    if [[ $code -ne 0 ]]; then echo "promote.sh: promotion failed (exit $code)" >&2; exit "$code"; fi
    if git diff --quiet -- 'glm5_lsp/weights/glm5-code-tiny/*.safetensors'; then
        echo "promote.sh: the run's weights were not better: nothing promoted, nothing refitted"
        exit 0
    fi
fi

rm -rf "$OUT"; mkdir -p "$OUT"
read -r -a FIT <<< "$("$PY" -c 'from glm5_lsp.train.corpus import BENCHMARK_FIT; print(" ".join(BENCHMARK_FIT))')"

echo "promote.sh: the interpolation table"
"$PY" -m glm5_lsp.memory.fit --max-tokens 12000 --out "$OUT/interpolation.json" | tee "$OUT/interpolation.log"
cp "$OUT/interpolation.json" glm5_lsp/memory/interpolation.json

echo "promote.sh: the gate's rows (${FIT[*]})"
collect() { "$PY" -m glm5_lsp.cli gate collect --packages "${FIT[@]}" "$@"; }
# One at a time, as the editor asks: the rows' timings and budget cuts are those of a request alone.
collect --positions 30 --seed 0 --no-block --out "$OUT/word.jsonl" > "$OUT/word.log" 2>&1
collect --positions 20 --at space --no-block --out "$OUT/space.jsonl" > "$OUT/space.log" 2>&1
collect --positions 30 --only-block --block-at line_start --block-budget-ms 2000 --out "$OUT/block.jsonl" \
    > "$OUT/block.log" 2>&1

echo "promote.sh: the gate"
"$PY" -m glm5_lsp.cli gate train --data "$OUT/word.jsonl" "$OUT/space.jsonl" "$OUT/block.jsonl" | tee "$OUT/gate.log"

threshold="$("$PY" -c 'from glm5_lsp.server.settings import EMBEDDED_MIN_QUALITY; print(EMBEDDED_MIN_QUALITY)')"
"$PY" - "$threshold" <<'EOF'
import re
import sys
from pathlib import Path

path = Path("extension/vscode/package.json")
text = path.read_text(encoding="utf-8")
pattern = r'("glm5\.completion\.minQuality": \{\s*"type": "number",\s*"default": )[0-9.]+'
new, count = re.subn(pattern, lambda m: m.group(1) + sys.argv[1], text)
if count != 1:
    sys.exit("promote.sh: completion.minQuality's default not found in extension/vscode/package.json")
path.write_text(new, encoding="utf-8")
EOF
"$PY" scripts/settings_reference.py --write

if [[ "${GLM5_PROMOTE_AB:-1}" == "1" ]]; then
    echo "promote.sh: the answers on FIT, these weights against the last commit's"
    before="$(mktemp -d)/committed"
    git worktree add --quiet --detach "$before" HEAD
    code=0
    "$PY" benchmarks/lines.py --fit --packages "${FIT[@]}" --positions 12 --systems mixed --baseline "$before" \
        --details "$OUT/fit_answers.jsonl" > "$OUT/fit_answers.log" 2>&1 || code=$?
    git worktree remove --force "$before"
    if [[ $code -eq 0 ]]; then tail -n 6 "$OUT/fit_answers.log"; else echo "promote.sh: the FIT comparison failed (exit $code; $OUT/fit_answers.log)" >&2; fi
fi
echo "promote.sh: done; completion.minQuality $threshold. git status shows what changed."
