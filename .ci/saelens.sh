#!/usr/bin/env bash
# CI: SAELens 6.54.12 (with the TransformerLens it requires, pinned to the release the rest of
# the comparisons use) in a virtual environment of its own (.ci/peer_env.sh), for the
# by-value comparison of hookedattn_tl.HookedSAETransformer with SAELens's
# (tests/tl/test_tl_sae_transformer.py runs scripts/saelens_probes.py in it as a subprocess).
# The tests look at ~/.cache/hookedattn/sae_lens-6.54.12 (or at $HOOKEDATTN_SAELENS_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
version=6.54.12
bash .ci/peer_env.sh sae_lens "$version" "sae_lens-$version" sae_lens \
    "sae-lens==$version" "transformer_lens==3.5.1"
