#!/usr/bin/env bash
# CI: TransformerLens 3.5.1 in a virtual environment of its own (.ci/peer_env.sh), for the
# by-value comparison of hookedattn_tl with it (tests/tl/test_tl_vs_transformer_lens.py runs
# scripts/tl_probes.py in it as a subprocess). The tests look at
# ~/.cache/hookedattn/transformer_lens-3.5.1 (or at $HOOKEDATTN_TL_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.5.1
bash .ci/peer_env.sh transformer_lens "$version" "transformer_lens-$version" transformer_lens \
    "transformer_lens==$version"
