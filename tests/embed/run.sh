#!/usr/bin/env bash
# Installs the troupe build into a temporary prefix, builds examples/embed against the
# installed package (find_package(troupe CONFIG)), runs it and checks that it printed the
# restart of the worker it killed.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/examples/embed" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
out=$(LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/embed" --threads=2)
echo "$out"
grep -q 'child=worker-2 gen=1 event=exit reason=killed' <<<"$out"
grep -q 'child=worker-2 gen=2 event=start' <<<"$out"
grep -q 'worker-2 restarted as generation 2; work(21) = 42' <<<"$out"
echo "embed: OK"
