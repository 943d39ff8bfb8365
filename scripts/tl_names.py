"""Write TransformerLens's model-name table as data: `hookedattn/core/hub/tl_models.json`.

TransformerLens loads a model by its official hub name or one of its aliases (`gpt2-small`
is `openai-community/gpt2`, `pythia-70m` is `EleutherAI/pythia-70m`, ...). hookedattn
resolves the same names (`hookedattn.core.hub`), from a table this script reads out of an
installed TransformerLens, so that the names follow TL's release rather than our memory:

    ~/.cache/hookedattn/transformer_lens-3.5.1/bin/python scripts/tl_names.py [OUT.json]

(the environment `.ci/transformer_lens.sh` builds). `--check OUT.json` exits 1 where the
file differs from what this TransformerLens says (tests/hub/test_names.py runs it so).
"""

import importlib.metadata
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "hookedattn/core/hub/tl_models.json"


def table() -> dict:
    """The official names, each with its aliases (TL's first alias is its default name)."""
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    return {
        "source": f"transformer_lens {importlib.metadata.version('transformer_lens')}",
        "models": {name: list(MODEL_ALIASES.get(name, [])) for name in OFFICIAL_MODEL_NAMES},
    }


def main(argv: list[str]) -> int:
    """Write the table (or, with `--check FILE`, compare FILE with it)."""
    check = argv[:1] == ["--check"]
    path = Path(argv[1] if check else argv[0]) if argv[check:] else OUT
    text = json.dumps(table(), indent=1, ensure_ascii=False) + "\n"
    if check:
        same = path.read_text() == text
        print(f"{path}: {'matches' if same else 'differs from'} {table()['source']}")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path}: {len(table()['models'])} official names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
