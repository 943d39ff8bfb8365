"""SAELens's release registry as the JSON the package ships (`releases.json`).

SAELens keeps its registry in `sae_lens/pretrained_saes.yaml`: per release the hub repo, the
model, the loader (`conversion_func`) and, per SAE, its id, folder, Neuronpedia id and L0.
This converts it into `hookedattn/sae/releases/releases.json`, keeping what loading and
searching need: per release `repo_id`, `model`, `format` (our name for the loader's files:
`saelens`, `gemma_scope`, `gemma_scope_2`, or SAELens's name for a loader we do not read),
`kind` (`sae` or `transcoder`) and `config_overrides`; per SAE a row of `id`, `path` (null
when it is the id), `neuronpedia`, `l0`, `norm_scaling_factor` (`columns` names them). Hook
names and widths are not stored: `hookedattn.sae.releases._naming` reads them off the names
when the registry is loaded. Links, variance explained and stray keys are left out. Entries
are as SAELens reads them: an SAE's extra keys are ignored, an int path becomes a string.

    pip download sae-lens --no-deps -d /tmp/sl
    python scripts/sae_releases.py /tmp/sl/sae_lens-6.54.12-py3-none-any.whl   # rewrite it
    python scripts/sae_releases.py /tmp/sl/sae_lens-6.54.12-py3-none-any.whl --check
    python scripts/sae_releases.py path/to/pretrained_saes.yaml                 # or the yaml

`--check` writes nothing and exits 1 when the shipped JSON is not what the source gives.
Needs PyYAML (a dependency of huggingface_hub).
"""

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

from hookedattn.sae.releases import _naming

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "hookedattn" / "sae" / "releases" / "releases.json"
MEMBER = "sae_lens/pretrained_saes.yaml"
# What each SAE keeps from the yaml: a row of these.
COLUMNS = ("id", "path", "neuronpedia", "l0", "norm_scaling_factor")


def read_source(source: Path) -> tuple[bytes, dict[str, str]]:
    """The yaml's bytes and where they came from: an sae-lens wheel (its version from the
    file name) or the yaml itself."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            if MEMBER not in wheel.namelist():
                raise SystemExit(f"{source} holds no {MEMBER}: is it an sae-lens wheel?")
            text = wheel.read(MEMBER)
        match = re.match(r"sae_lens-([^-]+)-", source.name)
        version = match.group(1) if match else "unknown"
        return text, {"package": "sae-lens", "version": version, "file": MEMBER}
    return source.read_bytes(), {"package": "sae-lens", "version": "unknown", "file": source.name}


def convert(registry: dict[str, Any], provenance: dict[str, str]) -> dict[str, Any]:
    """The shipped JSON's contents from the parsed yaml (`{release: {...}}`)."""
    releases = {name: release(raw) for name, raw in sorted(registry.items())}
    return {"source": provenance, "columns": list(COLUMNS), "releases": releases}


def release(raw: dict[str, Any]) -> dict[str, Any]:
    """One release's entry, each SAE a row of `COLUMNS` (a null path is the id; trailing
    nulls are dropped)."""
    conversion = raw.get("conversion_func")
    saes = []
    for sae in raw["saes"]:
        sae_id, path = str(sae["id"]), str(sae["path"])
        row = [sae_id, None if path == sae_id else path, *(sae.get(f) for f in COLUMNS[2:])]
        while row[-1] is None:
            row.pop()
        saes.append(row)
    paths = [str(s["path"]) for s in raw["saes"]]
    out = {"repo_id": raw["repo_id"], "model": raw["model"]}
    out |= {"format": _naming.format_of(conversion), "kind": _naming.kind(conversion, paths)}
    if raw.get("config_overrides"):
        out["config_overrides"] = raw["config_overrides"]
    out["saes"] = saes
    return out


def render(data: dict[str, Any]) -> str:
    """The JSON text: one line per SAE, so that a registry update reads as a small diff."""
    lines = ["{", f'"source": {json.dumps(data["source"], sort_keys=True)},']
    lines += [f'"columns": {json.dumps(data["columns"])},', '"releases": {']
    names = list(data["releases"])
    for i, name in enumerate(names):
        entry = dict(data["releases"][name])
        saes = entry.pop("saes")
        head = json.dumps(entry, sort_keys=True)[:-1]
        lines.append(f'{json.dumps(name)}: {head}, "saes": [')
        lines += [json.dumps(s) + ("," if j < len(saes) - 1 else "") for j, s in enumerate(saes)]
        lines.append("]}" + ("," if i < len(names) - 1 else ""))
    lines += ["}", "}"]
    return "\n".join(lines) + "\n"


def build(source: Path) -> str:
    """The JSON text `source` (a wheel or the yaml) gives."""
    import yaml

    text, provenance = read_source(source)
    provenance["sha256"] = hashlib.sha256(text).hexdigest()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return render(convert(yaml.load(text, Loader=loader), provenance))


def main(argv: list[str] | None = None) -> int:
    """Write (or `--check`) the shipped JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="an sae-lens wheel or pretrained_saes.yaml")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    text = build(args.source)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out} {'matches' if same else 'differs from'} {args.source}")
        return 0 if same else 1
    args.out.write_text(text)
    data = json.loads(text)
    n_saes = sum(len(r["saes"]) for r in data["releases"].values())
    print(f"wrote {args.out}: {len(data['releases'])} releases, {n_saes:,} SAEs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
