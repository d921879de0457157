#!/usr/bin/env bash
# Installs the troupe build into a temporary prefix, builds examples/custom-model against the
# installed package, and runs it: an MLP of the example's own trained elastically by troupe's
# actors, with one of its 3 worker processes killed at step 15. Checks that the job finished on 2
# workers after recovering, and that the loss went down.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/examples/custom-model" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
out=$(cd "$work" && "$work/build/custom_model" --steps 30 --work_dir "$work/job")
echo "$out"
grep -q 'chaos: kill -9 of rank 1' <<<"$out"
grep -q 'recovered: ' <<<"$out"
grep -q 'custom_model: 30 steps, final loss .*, world 2' <<<"$out"
first=$(grep -m1 '^step    1/30' <<<"$out" | awk '{print $4}')
last=$(grep -m1 '^step   30/30' <<<"$out" | awk '{print $4}')
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a / 2)) { print "loss did not halve: " a " -> " b; exit 1 } }'
echo "custom-model: OK"
