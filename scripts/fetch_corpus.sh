#!/usr/bin/env bash
# More code for the background run to read: the wheels pinned in scripts/corpus_packages.txt, fetched
# from PyPI and unpacked (no dependencies, nothing imported or run) into runs/corpus-pypi/site, which
# scripts/cpu_train.sh then reads beside this Python's own site-packages when it starts a new run.
#
#   scripts/fetch_corpus.sh           fetch and unpack (0.9 GB of wheels, 3.1 GB unpacked; about 5 minutes)
#
# Why: the embedded model had read the installed corpus (150 MB of source, 46M tokens) eight times over
# and its held-out perplexity had stopped falling; then it read the first 268 pins about three times
# over, and 241 more came (586 MB of source in the run's corpus, from 391 MB). The corpus builder treats this folder like any
# site-packages: permissive licences only (the wheels' own metadata), the benchmarks' packages
# (BENCHMARK_FIT, BENCHMARK_REPORT) and the held-out packages never trained on, the same file filters
# and HumanEval guard, duplicates dropped; the run's corpus_manifest.json lists what went in. The list
# leaves out every package installed here already and every benchmark package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ROOT="${GLM5_CORPUS_DIR:-runs/corpus-pypi}"
PIDFILE="${GLM5_RUN:-runs/continued}/train.pid"
if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "fetch_corpus.sh: a training run is reading $ROOT (pid $(cat "$PIDFILE")); stop it first (scripts/cpu_train.sh --stop)" >&2
    exit 1
fi
mkdir -p "$ROOT/wheels"
# pip's warnings about this machine's configured local indexes (absent folders) are left out
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# one pin at a time, four at once: a wheel PyPI no longer has is reported and the rest still come
failed="$ROOT/failed.txt"
: > "$failed"
grep -v '^#' scripts/corpus_packages.txt | grep . | xargs -P 4 -I{} sh -c \
    '"$0" -m pip download --no-deps --only-binary=:all: --python-version 3.11 -q -d "$1/wheels" "{}" 2>/dev/null \
     || echo "{}" >> "$2"' "$PY" "$ROOT" "$failed"
if [[ -s "$failed" ]]; then
    echo "fetch_corpus.sh: $(wc -l < "$failed") pinned wheels could not be fetched (see $failed): $(tr '\n' ' ' < "$failed")" >&2
fi
rm -rf "$ROOT/site.new"
quiet "$PY" -m pip install --no-deps --no-compile --no-warn-conflicts --disable-pip-version-check -q \
    --target "$ROOT/site.new" "$ROOT"/wheels/*.whl
rm -rf "$ROOT/site"
mv "$ROOT/site.new" "$ROOT/site"
echo "fetch_corpus.sh: $(ls -d "$ROOT"/site/*.dist-info | wc -l) distributions in $ROOT/site"
