#!/usr/bin/env bash
# CI: circuit-tracer 0.5 in a virtual environment of its own, for the check that our
# transcoder files are circuit-tracer's, both ways (tests/features/test_circuit_tracer_files.py
# runs scripts/circuit_tracer_files.py in it as a subprocess: circuit-tracer writes sets with
# its own to_safetensors and reads ours with its own loader; the environment never imports
# hookedattn). Cached under ~/.cache/hookedattn/, keyed like the TransformerLens one
# (.ci/transformer_lens.sh); a half-built environment (no .complete marker) is rebuilt.
# circuit-tracer 0.5.0 pins transformers to 4.56-4.57.3, which takes TransformerLens 3.2.1
# and nnsight 0.8.1 with it; the torch pin of constraints.txt holds (no conflict).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.0
key=$( (cat constraints.txt; python3 --version) | sha256sum | cut -c1-12)
cache="$HOME/.cache/hookedattn"
venv="$cache/circuit_tracer-$version-$key"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    start=$(date +%s)
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -c constraints.txt "circuit-tracer==$version"
    "$venv/bin/python" -c "import torch, yaml, circuit_tracer.transcoder, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    touch "$venv/.complete"
    echo "circuit-tracer $version: environment built in $(( $(date +%s) - start ))s: $venv"
else
    echo "circuit-tracer $version: cached environment $venv"
fi
# The tests look here (or at $HOOKEDATTN_CIRCUIT_TRACER_PYTHON).
ln -sfn "$venv" "$cache/circuit_tracer-${version%.*}"
