#!/usr/bin/env bash
# Installs the troupe build into a temporary prefix, builds one of examples/ against the
# installed package (find_package(troupe CONFIG)), runs it and checks what it printed:
#   embed         a supervisor restarts the worker that fault injection killed;
#   custom-model  an MLP of the example's own, trained elastically by troupe's actors with one of
#                 its 3 worker processes killed at step 15, finishes on 2 workers after recovering
#                 and at least halves its loss;
#   cxx-only      not an example: tests/embed/cxx-only, a project that enables only C++, links
#                 troupe::train (Cap'n Proto included) and round-trips a checkpoint manifest.
# A fourth argument ON (troupe's TROUPE_WERROR) builds the consumer with warnings as errors.
set -euo pipefail
build_dir=$1 source_dir=$2 example=$3 werror=${4:-OFF}
case "$example" in
  cxx-only) project_dir=$source_dir/tests/embed/cxx-only ;;
  *) project_dir=$source_dir/examples/$example ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$project_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_COMPILE_WARNING_AS_ERROR="$werror" >/dev/null
cmake --build "$work/build" >/dev/null
case "$example" in
  embed)
    out=$(LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/embed" --threads=2)
    echo "$out"
    grep -q 'child=worker-2 gen=1 event=exit reason=killed' <<<"$out"
    grep -q 'child=worker-2 gen=2 event=start' <<<"$out"
    grep -q 'worker-2 restarted as generation 2; work(21) = 42' <<<"$out"
    ;;
  custom-model)
    out=$(cd "$work" && "$work/build/custom_model" --steps 30 --work_dir "$work/job")
    echo "$out"
    grep -q 'chaos: kill -9 of rank 1' <<<"$out"
    grep -q 'recovered: ' <<<"$out"
    grep -q 'custom_model: 30 steps, final loss .*, world 2' <<<"$out"
    first=$(grep -m1 '^step    1/30' <<<"$out" | awk '{print $4}')
    last=$(grep -m1 '^step   30/30' <<<"$out" | awk '{print $4}')
    awk -v a="$first" -v b="$last" \
      'BEGIN { if (!(b < a / 2)) { print "loss did not halve: " a " -> " b; exit 1 } }'
    ;;
  cxx-only)
    # Nothing installed may refer to test support (train/testing/).
    if grep -rl -i 'fake_file_system\|train_testing' "$work/prefix"; then
      echo "cxx-only: the installed package refers to test support (above)" >&2; exit 1
    fi
    out=$("$work/build/cxx_only")
    echo "$out"
    grep -q 'cxx-only: manifest round trip, [0-9]* bytes, step 7' <<<"$out"
    ;;
  *) echo "run.sh: unknown example '$example'" >&2; exit 2 ;;
esac
echo "$example: OK"
