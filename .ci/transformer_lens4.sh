#!/usr/bin/env bash
# CI: TransformerLens 4.3.0 in a virtual environment of its own (.ci/peer_env.sh), for the
# by-value comparison of hookedattn_tl's TransformerBridge entry with TL 4's
# (tests/tl/test_tl_bridge.py runs scripts/tl4_probes.py in it as a subprocess). TL 4 removed
# HookedTransformer; its models start from transformer_lens.model_bridge.TransformerBridge.
# The tests look at ~/.cache/hookedattn/transformer_lens-4.3.0 (or at $HOOKEDATTN_TL4_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.3.0
bash .ci/peer_env.sh transformer_lens "$version" "transformer_lens-$version" \
    transformer_lens.model_bridge "transformer_lens==$version"
