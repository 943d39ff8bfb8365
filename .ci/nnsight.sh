#!/usr/bin/env bash
# CI: nnsight 0.8 in a virtual environment of its own (.ci/peer_env.sh), for the check that
# nnsight wraps our model as it is (tests/tl/test_nnsight.py runs scripts/nnsight_probe.py in
# it as a subprocess, with this checkout on PYTHONPATH: the environment holds nnsight, its
# dependencies and hookedattn's runtime dependencies, never hookedattn itself). The tests look
# at ~/.cache/hookedattn/nnsight-0.8 (or at $HOOKEDATTN_NNSIGHT_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.8.1
# hookedattn's runtime dependencies, read from pyproject.toml so that the two stay one list.
mapfile -t deps < <(python3 -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
')
bash .ci/peer_env.sh nnsight "$version" "nnsight-${version%.*}" \
    "nnsight, einops, jaxtyping, safetensors, tqdm" "nnsight==$version" "${deps[@]}"
