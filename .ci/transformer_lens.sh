#!/usr/bin/env bash
# CI: TransformerLens 3.5.1 in a virtual environment of its own, for the by-value comparison
# of hookedattn_tl with it (tests/tl/test_tl_vs_transformer_lens.py runs scripts/tl_probes.py in
# it as a subprocess). Cached under ~/.cache/hookedattn/, keyed by the TL version, the
# constraints (which pin torch to the local CPU wheel) and the Python version; a half-built
# environment (no .complete marker) is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.5.1
key=$( (cat constraints.txt; python3 --version) | sha256sum | cut -c1-12)
cache="$HOME/.cache/hookedattn"
venv="$cache/transformer_lens-$version-$key"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    start=$(date +%s)
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -c constraints.txt "transformer_lens==$version"
    "$venv/bin/python" -c "import torch, transformer_lens; print('torch', torch.__version__)"
    touch "$venv/.complete"
    echo "transformer_lens $version: environment built in $(( $(date +%s) - start ))s: $venv"
else
    echo "transformer_lens $version: cached environment $venv"
fi
# The tests look here (or at $HOOKEDATTN_TL_PYTHON).
ln -sfn "$venv" "$cache/transformer_lens-$version"
