#!/usr/bin/env bash
# CI: circuit-tracer 0.5 in a virtual environment of its own (.ci/peer_env.sh), for the check
# that our transcoder files are circuit-tracer's, both ways
# (tests/features/test_circuit_tracer_files.py runs scripts/circuit_tracer_files.py in it as a
# subprocess: circuit-tracer writes sets with its own to_safetensors and reads ours with its
# own loader; the environment never imports hookedattn). circuit-tracer 0.5.0 pins
# transformers to 4.56-4.57.3, which takes TransformerLens 3.2.1 and nnsight 0.8.1 with it;
# the torch pin of constraints.txt holds. The tests look at
# ~/.cache/hookedattn/circuit_tracer-0.5 (or at $HOOKEDATTN_CIRCUIT_TRACER_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.5.0
bash .ci/peer_env.sh circuit_tracer "$version" "circuit_tracer-${version%.*}" \
    "yaml, circuit_tracer.transcoder, transformers" "circuit-tracer==$version"
