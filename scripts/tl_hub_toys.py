"""TransformerLens's toy models as TL writes them and as TL loads them by name, run by TL itself.

Run as a program with real TransformerLens (in its own environment):

    python scripts/tl_hub_toys.py IN.pt OUT.pt

IN.pt holds `{"make": {file: {"config", "seed"}}}` or `{"load": {"names", "tokens",
"checkpoints"}}`.

- `make`: for each file, TL builds `HookedTransformer(HookedTransformerConfig(**config))`,
  draws every parameter at random (seeded, `tl_toy_variants.random_state`) and OUT.pt maps
  the file to `model.state_dict()`, buffers and all, the way TL's toy models were saved.
- `load`: for each name, `from_pretrained_no_processing(name)` and `from_pretrained(name)`
  (TL's default processing) fetch the model from the hub `HF_ENDPOINT` names, and OUT.pt
  maps the name to both models' logits on `tokens` (and the unprocessed model's in
  float64), the ids `to_tokens("w3 w17")` gives, and for a name in `checkpoints`
  (name -> step) the unprocessed logits at that step.

tests/hub/test_transformerlens_toys.py serves what `make` wrote from a hub on 127.0.0.1
and holds hookedattn's loads of the same names against what `load` answered.
"""

import sys
from typing import Any

import torch
from tl_toy_variants import random_state


def make(tl: Any, files: dict[str, dict]) -> dict[str, dict[str, torch.Tensor]]:
    """Each file's state dict: a TL model of its config with seeded random parameters."""
    written = {}
    for file, spec in files.items():
        model = tl.HookedTransformer(tl.HookedTransformerConfig(**spec["config"]))
        model.load_state_dict(random_state(model, spec["seed"]))
        written[file] = {k: v.clone() for k, v in model.state_dict().items()}
    return written


def load(tl: Any, names: list[str], tokens: torch.Tensor, checkpoints: dict[str, int]) -> dict:
    """What TL makes of each name on the hub: logits unprocessed and processed."""
    answers = {}
    for name in names:
        raw = tl.HookedTransformer.from_pretrained_no_processing(name)
        processed = tl.HookedTransformer.from_pretrained(name)
        raw64 = tl.HookedTransformer.from_pretrained_no_processing(name, dtype=torch.float64)
        answers[name] = {
            "raw": raw(tokens),
            "raw64": raw64(tokens),
            "processed": processed(tokens),
            "processed_normalization": processed.cfg.normalization_type,
            "ids": raw.to_tokens("w3 w17")[0].tolist(),
        }
        if name in checkpoints:
            at = tl.HookedTransformer.from_pretrained_no_processing(
                name, checkpoint_value=checkpoints[name]
            )
            answers[name]["checkpoint"] = at(tokens)
    return answers


def main() -> None:
    """`python scripts/tl_hub_toys.py IN.pt OUT.pt`, with TransformerLens importable."""
    import transformer_lens

    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    torch.set_grad_enabled(False)
    if "make" in given:
        torch.save(make(transformer_lens, given["make"]), target)
    else:
        asked = given["load"]
        answers = load(
            transformer_lens, asked["names"], asked["tokens"], asked.get("checkpoints", {})
        )
        torch.save(answers, target)


if __name__ == "__main__":
    main()
