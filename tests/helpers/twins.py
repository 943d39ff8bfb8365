"""Tiny random transformers twins and how far our numbers are from theirs, for the import
tests of single architectures (`tests/hf/test_hf_*.py`)."""

import torch
from torch import nn

from helpers.decomposition import assert_decomposition_sums_in
from hookedattn.core.hf import _tiny


def tiny_twin(model_type: str, seed: int = 0, **fields) -> nn.Module:
    """A tiny random model of `model_type` (its registered causal-LM class), `fields` set on
    its config, shrunk as the verification on load shrinks it."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type, **fields))
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    return _tiny.random_hf_model(model_class, config, seed=seed)


def relative_worst(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest `|got - want|`, over the largest `|want|`."""
    return float((got - want).abs().max()) / float(want.abs().max())


def streams_worst(model, reference: nn.Module, tokens: torch.Tensor) -> float:
    """The largest `relative_worst` of our logits and of every residual stream between the
    layers (`blocks.{i}.hook_resid_post` against HF's `hidden_states[i + 1]`; the last one,
    after HF's final norm, is left to the logits) from `reference`'s."""
    with torch.no_grad():
        expected = reference(tokens, output_hidden_states=True)
        logits, cache = model.run_with_cache(tokens)
    deltas = [relative_worst(logits, expected.logits)]
    for i in range(model.cfg.n_layers - 1):
        got, want = cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + 1]
        deltas.append(relative_worst(got, want))
    return max(deltas)


def piece_output(reference: nn.Module, layer: int, piece: str, tokens: torch.Tensor):
    """What `reference`'s layer `layer`'s submodule `piece` returns (its first output) when
    `reference` reads `tokens`."""
    seen = {}

    def keep(module, args, out):
        seen.setdefault("out", out[0] if isinstance(out, tuple) else out)

    handle = reference.model.layers[layer].get_submodule(piece).register_forward_hook(keep)
    try:
        with torch.no_grad():
            reference(tokens)
    finally:
        handle.remove()
    return seen["out"]


def assert_decomposition_sums(model, tokens: torch.Tensor, granularities: tuple[str, ...]) -> None:
    """`decompose_resid` of `model` on `tokens` at each granularity sums to the last stream
    (float64: to 1e-10)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    assert_decomposition_sums_in(model, cache, granularities)


def assert_files_read_as_the_live_model(reference: nn.Module, folder) -> None:
    """`reference` imported live and from `folder` (where it was saved) holds the same
    tensors, each equal."""
    from hookedattn import HookedTransformer

    live, saved = HookedTransformer.from_hf(reference), HookedTransformer.from_hf(folder)
    for name, tensor in live.state_dict().items():
        assert torch.equal(saved.state_dict()[name], tensor), name


def assert_saved_twin_loads_like_the_live_model(reference: nn.Module, folder) -> None:
    """`reference` saved under `folder / "model"` and imported from there holds the live
    import's tensors under the same names, each equal."""
    from hookedattn import HookedTransformer

    live = HookedTransformer.from_hf(reference)
    reference.save_pretrained(folder / "model")
    loaded = HookedTransformer.from_hf(folder / "model")
    ours = live.state_dict()
    assert loaded.state_dict().keys() == ours.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ours[name]), name


def write_worst(reference: nn.Module, ours: str, layer: int, piece: str, tokens) -> float:
    """The `relative_worst` of our import's hook point `ours` from what `reference`'s layer
    `layer`'s submodule `piece` returns, both reading `tokens`."""
    from hookedattn import HookedTransformer

    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=ours)
    return relative_worst(cache[ours], piece_output(reference, layer, piece, tokens))


def attn_out_worsts(reference: nn.Module, tokens: torch.Tensor) -> list[float]:
    """For each layer, the `relative_worst` of our import's `hook_attn_out` from what
    `reference`'s `self_attn` returns (its first output), both reading `tokens`."""
    from hookedattn import HookedTransformer

    model = HookedTransformer.from_hf(reference)
    seen = {}
    for i, layer in enumerate(reference.model.layers):
        hook = lambda m, args, out, i=i: seen.update({i: out[0]})
        layer.self_attn.register_forward_hook(hook)
    with torch.no_grad():
        reference(tokens)
        _, cache = model.run_with_cache(tokens)
    return [relative_worst(cache[f"blocks.{i}.hook_attn_out"], seen[i]) for i in sorted(seen)]


def logits_worst(reference: nn.Module, tokens: torch.Tensor) -> float:
    """The `relative_worst` of our import's logits on `tokens` from `reference`'s."""
    from hookedattn import HookedTransformer

    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(tokens).logits
        logits = model(tokens)
    return relative_worst(logits, expected)
