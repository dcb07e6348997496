#!/usr/bin/env bash
# Continued training of the embedded model on this machine's CPU, in the background, at low priority.
#
#   scripts/cpu_train.sh              start (from the shipped weights, reading on from where they left the
#                                     corpus) or resume the run in runs/continued; detached, nice 19, 1 thread
#   scripts/cpu_train.sh --stop       stop cleanly: the step finishes and a checkpoint is written
#   scripts/cpu_train.sh --status     running or not, steps, tokens, the last loss
#   scripts/cpu_train.sh --promote    stop, measure held-out perplexity against the shipped model, write the
#                                     weights into the package when better, re-measure HumanEval and
#                                     single-line infilling for the model card, then start again
#   scripts/cpu_train.sh --foreground run in this terminal (Ctrl-C stops it cleanly)
#
# A run killed at any moment loses at most its last checkpoint interval (5 minutes). The run folder
# (runs/ is not committed) survives only on this machine: a new checkout starts a new run from the
# shipped weights, which record where in the corpus they stopped (metrics.json, "continued").
# Knobs (environment): GLM5_RUN (run folder, default runs/continued), GLM5_FROM (the model folder a
# new run starts from, default the shipped weights: say an upcycled copy of them, made by
# `python -m glm5_lsp.train.upcycle`; a run that exists resumes whatever it started from), GLM5_EVAL (1/0: re-measure
# HumanEval after a promotion, default 1), GLM5_BENCHMARKS (default ../shared/benchmarks), GLM5_GROUP_NICE
# (the run's scheduling-group nice value, default 5), GLM5_EXTRA_SITE (more code for a new run to read,
# default runs/corpus-pypi/site: scripts/fetch_corpus.sh fills it).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="${GLM5_RUN:-runs/continued}"
PY="${PYTHON:-python3}"
BENCH="${GLM5_BENCHMARKS:-../shared/benchmarks}"
WEIGHTS=glm5_lsp/weights/glm5-code-tiny
FROM="${GLM5_FROM:-$WEIGHTS}"
PIDFILE="$RUN/train.pid"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

lowest() { echo nice -n 19; }

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# A new run reads this Python's site-packages and, once scripts/fetch_corpus.sh has filled it, the
# folder of fetched wheels beside them (GLM5_EXTRA_SITE, default runs/corpus-pypi/site).
site_args() {
    local extra="${GLM5_EXTRA_SITE:-runs/corpus-pypi/site}"
    [[ -d "$extra" ]] || return 0
    "$PY" -c "import sys; from glm5_lsp.train.corpus import default_site_dirs; \
print(' '.join('--site-dir ' + str(p) for p in (*default_site_dirs(), sys.argv[1])))" "$extra"
}

train_cmd() {
    if [[ -f "$RUN/run.json" ]]; then
        echo "$PY" -m glm5_lsp.cli train --resume "$RUN" --threads 1
    else
        echo "$PY" -m glm5_lsp.cli train --continue-from "$FROM" --out "$RUN" --threads 1 --benchmarks "$BENCH" \
            "$(site_args)"
    fi
}

start() {
    if running; then echo "cpu_train.sh: already running (pid $(cat "$PIDFILE"))"; return 0; fi
    mkdir -p "$RUN"
    # setsid gives it a scheduling group of its own (Linux autogroups), which gets a fair share of the
    # CPU against each other session whatever the task's nice value: the group's own nice sets that
    # share (GLM5_GROUP_NICE, default 5: about a quarter of a contended core against one busy
    # session; 19 would starve it whenever anything else runs). The run sets it from inside its new
    # session: written from here, it could land before setsid and renice the caller's own group.
    # shellcheck disable=SC2016,SC2046
    setsid nohup bash -c 'echo "$1" > /proc/self/autogroup 2>/dev/null; shift; exec "$@"' group-nice \
        "${GLM5_GROUP_NICE:-5}" $(lowest) $(train_cmd) >>"$RUN/console.log" 2>&1 < /dev/null &
    local pid=$!
    echo $pid > "$PIDFILE"
    echo "cpu_train.sh: training in the background (pid $!, log $RUN/console.log, steps $RUN/train_log.jsonl)"
}

stop() {
    if ! running; then echo "cpu_train.sh: not running"; return 0; fi
    local pid; pid="$(cat "$PIDFILE")"
    kill -TERM "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then echo "cpu_train.sh: pid $pid did not stop within 120 s" >&2; return 1; fi
    rm -f "$PIDFILE"
    echo "cpu_train.sh: stopped (checkpoint in $RUN/checkpoint)"
}

status() {
    if running; then echo "running (pid $(cat "$PIDFILE"))"; else echo "not running"; fi
    [[ -f "$RUN/checkpoint/state.json" ]] && "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); \
print(f\"checkpoint: run step {s['run_step']}, {s['tokens_total']:,} tokens in all, loss {s['last_loss']}, position {s['position']}\")" \
        "$RUN/checkpoint/state.json"
    [[ -f "$RUN/train_log.jsonl" ]] && tail -n 1 "$RUN/train_log.jsonl" | cut -c1-300
    return 0
}

promote() {
    local was_running=0
    if running; then was_running=1; stop; fi
    local code=0
    $(lowest) "$PY" -m glm5_lsp.cli train --promote "$RUN" --threads 1 || code=$?
    if [[ $code -eq 0 && "${GLM5_EVAL:-1}" == "1" && -d "$BENCH" ]]; then
        local out="$RUN/eval"
        rm -rf "$out"; mkdir -p "$out"
        $(lowest) "$PY" -m glm5_lsp.cli eval humaneval --data "$BENCH/humaneval/HumanEval.jsonl.gz" \
            --repair-rounds 1 --max-tokens 128 --out "$out/he" --no-progress
        $(lowest) "$PY" -m glm5_lsp.cli eval humaneval-infilling \
            --data "$BENCH/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz" --limit 200 \
            --repair-rounds 1 --max-tokens 32 --out "$out/single" --no-progress
        "$PY" -m glm5_lsp.cli train --out "$WEIGHTS" --add-eval "$out/he/report.json" --add-eval "$out/single/report.json"
    fi
    if [[ $was_running -eq 1 ]]; then start; fi
    [[ $code -eq 0 || $code -eq 3 ]]  # 3: measured, not better: nothing written
}

case "${1:-}" in
    "") start ;;
    --stop) stop ;;
    --status) status ;;
    --promote) promote ;;
    --foreground) exec $(lowest) $(train_cmd) ;;
    *) echo "usage: scripts/cpu_train.sh [--stop|--status|--promote|--foreground]" >&2; exit 2 ;;
esac
