"""nnsight 0.8 over our model, as its users write it: read, edit, cache, generate.

`probe(folder, tokens, head, steer, max_new_tokens)` is nnsight code: it loads a model saved
with `HookedTransformer.save`, wraps it as it is (`nnsight.NNsight(model)`) and returns a
dict of named results, each one a `with model.trace(...)` block:

- `read/*`: one hook point of each kind by attribute (`model.blocks[0].attn.hook_pattern`,
  `hook_z` and its `.input`, the MLP's `hook_post` (expert 0's in a mixture),
  `hook_resid_post`, `unembed.hook_out`), the `.input` of block 1, and the model's
  `.output` (the logits);
- `cache/*`: every hook point's output, by `tracer.cache` (nnsight's `run_with_cache`);
- `zeroed/*`: head `head` of `blocks.0.attn.hook_z` set to zero in place, then the logits
  and every hook point's output after the edit;
- `steered/*`: `steer` added to `blocks.0.hook_resid_post` by assigning `.output`;
- `invokes/*`: a trace of two invokes, one with the tokens and one empty (the whole batch);
  `batched/error`: what plain `NNsight` says to two invokes of their own inputs;
- `generate/*`: `model.generate` traced (`fn="generate"`), `unembed.hook_out` read at each
  step (`tracer.iter`), once as it is and once with the head zeroed at step 1 only.

Run as a program in nnsight's environment (`.ci/nnsight.sh`), this checkout on PYTHONPATH:

    python scripts/nnsight_probe.py IN.pt OUT.pt

reads `{"runs": {name: folder}, "tokens", "head", "steer", "max_new_tokens"}` from IN.pt
(`steer` one vector per run name) and writes `{"nnsight": version, name: results}`.
tests/tl/test_nnsight.py runs it so, and holds the results against `run_with_cache` and
`run_with_hooks` of the same model.
"""

import sys
from typing import Any

import nnsight
import torch

from hookedattn import HookedTransformer


def probe(
    folder: str, tokens: torch.Tensor, head: int, steer: torch.Tensor, max_new_tokens: int
) -> dict[str, Any]:
    """Every named result for the model saved in `folder` (module docstring)."""
    ours = HookedTransformer.load(folder)
    names = list(ours.hook_dict)  # every hook point, in the order the forward reaches them
    model = nnsight.NNsight(ours)  # as it is: nnsight's own name for the wrapped model
    out: dict[str, Any] = {}

    # Reads: each `.output` (and `.input`) asked for in the order the forward reaches it.
    with model.trace(tokens):
        attn = model.blocks[0].attn
        out["read/pattern"] = attn.hook_pattern.output.save()
        out["read/z_input"] = attn.hook_z.input.save()
        out["read/z"] = attn.hook_z.output.save()
        mlp = model.blocks[0].mlp
        mlp = mlp.experts[0] if hasattr(ours.blocks[0].mlp, "experts") else mlp  # a mixture's
        out["read/mlp_post"] = mlp.hook_post.output.save()
        out["read/resid_post"] = model.blocks[0].hook_resid_post.output.save()
        out["read/block1_input"] = model.blocks[1].input.save()
        out["read/hook_out"] = model.unembed.hook_out.output.save()
        out["read/logits"] = model.output.save()

    with model.trace(tokens) as tracer:
        cache = tracer.cache(modules=[f"model.{name}" for name in names])
    out |= {f"cache/{name}": cache[f"model.{name}"].output for name in names}

    # Edits: in place on the value, or by assigning `.output`.
    with model.trace(tokens) as tracer:
        cache = tracer.cache(modules=[f"model.{name}" for name in names])
        model.blocks[0].attn.hook_z.output[:, :, head] = 0.0
        out["zeroed/logits"] = model.output.save()
    out |= {f"zeroed/cache/{name}": cache[f"model.{name}"].output for name in names}

    with model.trace(tokens):
        point = model.blocks[0].hook_resid_post
        point.output = point.output + steer
        out["steered/logits"] = model.output.save()

    # Invokes: one with the tokens, one empty (it sees the whole batch of the same run).
    with model.trace() as tracer:
        with tracer.invoke(tokens):
            out["invokes/resid_post"] = model.blocks[0].hook_resid_post.output.save()
        with tracer.invoke():
            out["invokes/logits"] = model.output.save()
    out["batched/error"] = _batched_error(model, tokens)

    out |= _generation(model, tokens, head, max_new_tokens)
    return {key: _plain(value) for key, value in out.items()}


def _batched_error(model: Any, tokens: torch.Tensor) -> str:
    """What two invokes of their own inputs raise on a plain `NNsight` ("" if nothing)."""
    try:
        with model.trace() as tracer:
            with tracer.invoke(tokens[:1]):
                model.output.save()
            with tracer.invoke(tokens[1:]):
                model.output.save()
    except NotImplementedError as error:
        return f"{type(error).__name__}: {error}"
    return ""


def _generation(model: Any, tokens: torch.Tensor, head: int, n: int) -> dict[str, Any]:
    """`model.generate` traced: each step's logits, as it is and with `head` zeroed at step 1
    (the first decoding step after the prompt's forward)."""
    out: dict[str, Any] = {}
    options = dict(fn="generate", max_new_tokens=n, do_sample=False, stop_at_eos=False)
    with model.trace(tokens, **options) as tracer:
        steps = nnsight.save([])
        for _ in tracer.iter[:n]:
            steps.append(model.unembed.hook_out.output)
        out["generate/tokens"] = tracer.result.save()
    out["generate/steps"] = list(steps)
    with model.trace(tokens, **options) as tracer:
        steps = nnsight.save([])
        for step in tracer.iter[:n]:
            if step == 1:
                model.blocks[0].attn.hook_z.output[:, :, head] = 0.0
            steps.append(model.unembed.hook_out.output)
        out["generate/zeroed_tokens"] = tracer.result.save()
    out["generate/zeroed_steps"] = list(steps)
    return out


def _plain(value: Any) -> Any:
    """Tensors detached and copied (a view of the edited batch keeps no graph), lists
    walked; strings as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def main(source: str, target: str) -> None:
    given = torch.load(source, weights_only=False)
    results: dict[str, Any] = {"nnsight": nnsight.__version__}
    for name, folder in given["runs"].items():
        results[name] = probe(
            folder,
            given["tokens"],
            given["head"],
            given["steer"][name],
            given["max_new_tokens"],
        )
    torch.save(results, target)


if __name__ == "__main__":
    main(*sys.argv[1:])
