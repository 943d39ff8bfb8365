#!/usr/bin/env bash
# CI: nnsight 0.8 in a virtual environment of its own, for the check that nnsight wraps our
# model as it is (tests/tl/test_nnsight.py runs scripts/nnsight_probe.py in it as a
# subprocess, with this checkout on PYTHONPATH: the environment holds nnsight, its
# dependencies and hookedattn's runtime dependencies, never hookedattn itself). Cached under
# ~/.cache/hookedattn/, keyed like the TransformerLens one (.ci/transformer_lens.sh) and by
# hookedattn's runtime dependencies; a half-built environment (no .complete marker) is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.8.1
# hookedattn's runtime dependencies, read from pyproject.toml so that the two stay one list.
deps=$(python3 -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
')
key=$( (cat constraints.txt; python3 --version; echo "$deps") | sha256sum | cut -c1-12)
cache="$HOME/.cache/hookedattn"
venv="$cache/nnsight-$version-$key"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    start=$(date +%s)
    python3 -m venv "$venv"
    mapfile -t requirements <<< "$deps"
    "$venv/bin/pip" install -q -c constraints.txt "nnsight==$version" "${requirements[@]}"
    "$venv/bin/python" -c "import torch, nnsight, einops, jaxtyping, safetensors, tqdm; print('torch', torch.__version__)"
    touch "$venv/.complete"
    echo "nnsight $version: environment built in $(( $(date +%s) - start ))s: $venv"
else
    echo "nnsight $version: cached environment $venv"
fi
# The tests look here (or at $HOOKEDATTN_NNSIGHT_PYTHON).
ln -sfn "$venv" "$cache/nnsight-${version%.*}"
