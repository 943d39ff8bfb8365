#!/usr/bin/env bash
# CI: SAELens 6.54.12 (with the TransformerLens it requires) in a virtual environment of its
# own, for the by-value comparison of hookedattn_tl.HookedSAETransformer with SAELens's
# (tests/tl/test_tl_sae_transformer.py runs scripts/saelens_probes.py in it as a
# subprocess). Cached under ~/.cache/hookedattn/, keyed as .ci/transformer_lens.sh keys its
# environment (the constraints, which pin torch to the local CPU wheel, the Python version)
# and by the packages; a half-built environment (no .complete marker) is rebuilt.
# TransformerLens is pinned to the release the rest of the comparisons use.
set -euo pipefail
cd "$(dirname "$0")/.."
version=6.54.12
packages=("sae-lens==$version" "transformer_lens==3.5.1")
key=$( (cat constraints.txt; python3 --version; echo "${packages[@]}") | sha256sum | cut -c1-12)
cache="$HOME/.cache/hookedattn"
venv="$cache/sae_lens-$version-$key"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    start=$(date +%s)
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -c constraints.txt "${packages[@]}"
    "$venv/bin/python" -c "import torch, sae_lens; print('torch', torch.__version__)"
    touch "$venv/.complete"
    echo "sae_lens $version: environment built in $(( $(date +%s) - start ))s: $venv"
else
    echo "sae_lens $version: cached environment $venv"
fi
# The tests look here (or at $HOOKEDATTN_SAELENS_PYTHON).
ln -sfn "$venv" "$cache/sae_lens-$version"
