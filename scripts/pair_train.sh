#!/usr/bin/env bash
# One model trained on both cores: the continued run (runs/continued) and a second run of the same
# model reading the corpus in its own order (runs/continued-b, cloned from the first on first use),
# averaged every GLM5_MERGE_MINUTES (default 60) by a small loop in the background
# (glm5_lsp/train/merge.py: local SGD; the averaged weights are what --promote then measures).
#
#   scripts/pair_train.sh             start both runs and the merging loop (or resume them)
#   scripts/pair_train.sh --merge     stop both, average them now, start both again
#   scripts/pair_train.sh --stop      stop the loop and both runs (each writes its checkpoint)
#   scripts/pair_train.sh --status    the loop and both runs
#
# To promote: `scripts/pair_train.sh --stop` (the loop must not merge mid-promotion), then
# `python -m glm5_lsp.cli train --merge runs/continued runs/continued-b` (the run promoted holds both),
# `scripts/promote.sh`, and `scripts/pair_train.sh` to start the pair and the loop again.
# Each run is started and stopped by scripts/cpu_train.sh (GLM5_RUN), nice 19, one thread each.
# GLM5_PAIR_POLL: seconds between the loop's looks for the first run's first checkpoint (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
FIRST="${GLM5_RUN:-runs/continued}"
SECOND="${GLM5_PAIR_RUN:-runs/continued-b}"
MINUTES="${GLM5_MERGE_MINUTES:-60}"
LOOP_PID="$FIRST/pair.pid"
LOG="$FIRST/pair.log"

loop_running() { [[ -f "$LOOP_PID" ]] && kill -0 "$(cat "$LOOP_PID")" 2>/dev/null; }

both() { GLM5_RUN="$FIRST" scripts/cpu_train.sh "$@"; GLM5_RUN="$SECOND" scripts/cpu_train.sh "$@"; }

# The second run is a clone of the first's checkpoint: on a new checkout the first run has none until
# its first checkpoint interval (5 minutes) has passed, so the clone waits for it.
second_ready() {
    [[ -f "$SECOND/run.json" ]] && return 0
    [[ -f "$FIRST/checkpoint/state.json" ]] || return 1
    GLM5_RUN="$FIRST" scripts/cpu_train.sh --stop
    "$PY" -m glm5_lsp.cli train --clone "$FIRST" --out "$SECOND"
}

merge_now() {
    both --stop || true  # (a run that will not stop is refused by the merge, which says so)
    if "$PY" -m glm5_lsp.cli train --merge "$FIRST" "$SECOND"; then
        echo "$(date -u +%FT%TZ) merged"
    else
        echo "$(date -u +%FT%TZ) the merge failed; both runs go on from their own weights" >&2
    fi
    both
}

case "${1:-}" in
    --status)
        if loop_running; then echo "merging loop: running (pid $(cat "$LOOP_PID"), every $MINUTES min)"
        else echo "merging loop: not running"; fi
        echo "$FIRST: $(GLM5_RUN="$FIRST" scripts/cpu_train.sh --status | sed -n 1p)"
        echo "$SECOND: $(GLM5_RUN="$SECOND" scripts/cpu_train.sh --status | sed -n 1p)"
        ;;
    --stop)
        if loop_running; then  # the loop, then its sleep (bash acts on the signal once the sleep ends)
            pid="$(cat "$LOOP_PID")"; kill "$pid"; pkill -P "$pid" || true; rm -f "$LOOP_PID"
        fi
        both --stop
        ;;
    --merge)
        merge_now
        ;;
    --loop)  # the background loop itself
        if [[ ! -f "$SECOND/run.json" ]]; then
            until second_ready; do sleep "${GLM5_PAIR_POLL:-60}"; done
            echo "$(date -u +%FT%TZ) cloned $FIRST into $SECOND"
            both
        fi
        while true; do
            sleep "$((MINUTES * 60))"
            merge_now
        done
        ;;
    "")
        if second_ready; then
            both
        else
            GLM5_RUN="$FIRST" scripts/cpu_train.sh
            echo "pair_train.sh: $SECOND is cloned from $FIRST's first checkpoint, once written (the loop does it)"
        fi
        if loop_running; then
            echo "pair_train.sh: merging loop already running (pid $(cat "$LOOP_PID"))"
        else
            setsid nohup "$0" --loop >>"$LOG" 2>&1 < /dev/null &
            echo $! > "$LOOP_PID"
            echo "pair_train.sh: merging every $MINUTES min (pid $!, log $LOG)"
        fi
        ;;
    *)
        echo "usage: scripts/pair_train.sh [--status | --stop | --merge]" >&2
        exit 2
        ;;
esac
