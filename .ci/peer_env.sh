#!/usr/bin/env bash
# A peer library in a virtual environment of its own, for the by-value comparisons:
#
#     bash .ci/peer_env.sh NAME VERSION LINK "IMPORTS" PACKAGE...
#
# builds ~/.cache/hookedattn/NAME-VERSION-KEY with `pip install -c constraints.txt PACKAGE...`
# (KEY hashes the constraints, which pin torch to the local CPU wheel, the Python version and
# the packages), checks that `import IMPORTS` works, marks it complete (a half-built one, with
# no .complete marker, is rebuilt) and links it as ~/.cache/hookedattn/LINK, where the tests
# look for it. Cached: a second run only links.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 version=$2 link=$3 imports=$4
shift 4
key=$( (cat constraints.txt; python3 --version; echo "$@") | sha256sum | cut -c1-12)
cache="$HOME/.cache/hookedattn"
venv="$cache/$name-$version-$key"
if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    mkdir -p "$cache"
    start=$(date +%s)
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -c constraints.txt "$@"
    "$venv/bin/python" -c "import torch, $imports; print('torch', torch.__version__)"
    touch "$venv/.complete"
    echo "$name $version: environment built in $(( $(date +%s) - start ))s: $venv"
else
    echo "$name $version: cached environment $venv"
fi
ln -sfn "$venv" "$cache/$link"
