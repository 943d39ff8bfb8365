"""Every hookedattn_tl function, called through TransformerLens's API, for a by-value comparison.

`probes(tl, weights, config, from_end)` is TransformerLens code: given a module that answers
to TL's API (`transformer_lens` itself, or `hookedattn_tl`), a state dict and a config
dict, it builds the model and returns a dict of named results (tensors, lists, numbers):
the cache's analysis methods with their options, every patching function (the pattern
setters by destination and source position included), hooks and hook levels, generation,
the key/value cache, start/stop layers, `utils`, `FactoredMatrix` and the composition
scores. With `from_end`, every layer argument is spelled counting from the end (`-2` for
`n_layers - 1`, ...), so that the facade's negatives are held against real TL's positives.

Run as a program with real TransformerLens (in its own environment):

    python scripts/tl_probes.py IN.pt OUT.pt

reads `{"weights", "config", "demo", "cached_runs"}` from IN.pt, and writes to OUT.pt the
probes' results, those of the Main-Demo script `demo` (TL code, run as written), and the
logits and cache of each model of `cached_runs` (name -> config, weights, tokens).
tests/tl/test_tl_vs_transformer_lens.py runs it so, and the same probes on hookedattn_tl.
"""

import importlib.metadata
import sys
from typing import Any

import torch


def probes(tl: Any, weights: dict, config: dict, from_end: bool = False) -> dict[str, Any]:
    """The named results of every probed function on one model (see the module docstring)."""
    cfg = tl.HookedTransformerConfig(**config)
    model = tl.HookedTransformer(cfg)
    model.load_state_dict(weights, strict=False)
    model.eval()
    n_layers = cfg.n_layers

    def at(layer: int) -> int:
        """`layer` (0..n_layers), spelled from the end when asked: n_layers -> -1."""
        return layer - n_layers - 1 if from_end else layer

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, cfg.d_vocab, (2, 5), generator=generator)
    corrupted = tokens.clone()
    corrupted[:, 2] = (tokens[:, 2] + 5) % cfg.d_vocab
    out: dict[str, Any] = {}
    logits, cache = model.run_with_cache(tokens)
    out["logits"] = logits
    out["cache_keys"] = sorted(cache.keys())
    out["loss"] = model(tokens, return_type="loss")
    out["loss_per_token"] = model(tokens, return_type="loss", loss_per_token=True)
    _cache_methods(out, cache, tokens, n_layers, at)
    _patching(tl, out, model, tokens, corrupted, cache)
    _model_methods(tl, out, model, tokens, n_layers, at)
    return out


def _cache_methods(out: dict, cache: Any, tokens: torch.Tensor, n_layers: int, at: Any) -> None:
    for layer in range(n_layers + 1):
        for incl_mid in (False, True):
            stack, labels = cache.accumulated_resid(
                at(layer), incl_mid=incl_mid, return_labels=True
            )
            out[f"accumulated_resid/{layer}/mid={incl_mid}"] = (stack, labels)
        out[f"accumulated_resid/{layer}/ln"] = cache.accumulated_resid(
            at(layer), apply_ln=True, pos_slice=-1
        )
        for mode in ("all", "attn", "mlp"):
            out[f"decompose_resid/{layer}/{mode}"] = cache.decompose_resid(
                at(layer), mode=mode, return_labels=True
            )
        out[f"decompose_resid/{layer}/ln"] = cache.decompose_resid(
            at(layer), apply_ln=True, pos_slice=(1, 5)
        )
        out[f"stack_head_results/{layer}"] = cache.stack_head_results(
            at(layer), return_labels=True, incl_remainder=layer > 0
        )
        out[f"stack_head_results/{layer}/ln"] = cache.stack_head_results(
            at(layer), pos_slice=-1, apply_ln=True
        )
        out[f"stack_neuron_results/{layer}"] = cache.stack_neuron_results(
            at(layer), pos_slice=-1, return_labels=True
        )
        out[f"full_resid_decomposition/{layer}"] = cache.get_full_resid_decomposition(
            at(layer), expand_neurons=False, pos_slice=-1, return_labels=True
        )
    for layer in range(n_layers):
        out[f"decompose_resid/{layer}/mlp_input"] = cache.decompose_resid(
            at(layer), mlp_input=True, return_labels=True
        )
        out[f"accumulated_resid/{layer}/mlp_input"] = cache.accumulated_resid(
            at(layer), mlp_input=True, return_labels=True
        )
        out[f"neuron_results/{layer}"] = cache.get_neuron_results(layer, pos_slice=-1)
        out[f"full_resid_decomposition/{layer}/neurons"] = cache.get_full_resid_decomposition(
            at(layer), mlp_input=True, pos_slice=-1, return_labels=True
        )
    out["stack_activation/pattern"] = cache.stack_activation("pattern", at(n_layers))
    out["stack_activation/resid_pre"] = cache.stack_activation("resid_pre")
    direction = cache.model.tokens_to_residual_directions(tokens[:, -1])
    stack = cache.decompose_resid(pos_slice=-1)
    out["apply_ln_to_stack"] = cache.apply_ln_to_stack(stack, at(n_layers), pos_slice=-1)
    out["logit_attrs"] = cache.logit_attrs(stack, tokens[:, -1], tokens[:, 0], pos_slice=-1)
    out["residual_directions"] = direction
    out["cache_keys/after_analysis"] = sorted(cache.keys())
    out["cache_shorthand"] = [cache["k", 1], cache["z", -1], cache["scale", 0, "ln1"]]


def _patching(
    tl: Any,
    out: dict,
    model: Any,
    tokens: torch.Tensor,
    corrupted: torch.Tensor,
    cache: Any,
) -> None:
    clean_logits, corrupted_logits = model(tokens), model(corrupted)
    target = tokens[:, -1]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        picked = logits[:, -1].gather(-1, target[:, None])[:, 0]
        base = corrupted_logits[:, -1].gather(-1, target[:, None])[:, 0]
        scale = clean_logits[:, -1].gather(-1, target[:, None])[:, 0] - base
        return ((picked - base) / scale).mean()

    names = [
        "get_act_patch_resid_pre",
        "get_act_patch_resid_mid",
        "get_act_patch_attn_out",
        "get_act_patch_mlp_out",
        "get_act_patch_attn_head_out_by_pos",
        "get_act_patch_attn_head_out_all_pos",
        "get_act_patch_attn_head_q_by_pos",
        "get_act_patch_attn_head_k_all_pos",
        "get_act_patch_attn_head_v_by_pos",
        "get_act_patch_attn_head_pattern_all_pos",
        "get_act_patch_attn_head_pattern_by_pos",
        "get_act_patch_attn_head_pattern_dest_src_pos",
        "get_act_patch_attn_head_all_pos_every",
        "get_act_patch_attn_head_by_pos_every",
        "get_act_patch_block_every",
    ]
    for name in names:
        out[f"patching/{name}"] = getattr(tl.patching, name)(model, corrupted, cache, metric)


def _model_methods(
    tl: Any, out: dict, model: Any, tokens: torch.Tensor, n_layers: int, at: Any
) -> None:
    seen = []

    def record(activation: torch.Tensor, hook: Any) -> None:
        seen.append((hook.name, activation.clone()))

    def double(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        return activation * 2

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_mid", double)]):
        out["hooks/outer_level"] = model.context_level
        with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_z"), record)]):
            out["hooks/inner_level"] = model.context_level
            out["hooks/nested_logits"] = model(tokens)
        out["hooks/after_inner"] = model(tokens)
    out["hooks/recorded"] = seen
    out["hooks/after_all"] = model(tokens)
    for stop in range(n_layers + 1):
        resid = model(tokens, stop_at_layer=stop)
        out[f"stop_at_layer/{stop}"] = resid
        out[f"start_at_layer/{stop}"] = model(resid, start_at_layer=stop)
    out["stop_at_layer/-1"] = model(tokens, stop_at_layer=-1)
    cache_kv = tl.TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    # TL reads padding off the tokens when no mask is given, which needs a tokenizer.
    first = model(
        tokens[:, :3], past_kv_cache=cache_kv, attention_mask=torch.ones(2, 3, dtype=torch.long)
    )
    rest = model(
        tokens[:, 3:], past_kv_cache=cache_kv, attention_mask=torch.ones(2, 2, dtype=torch.long)
    )
    out["kv_cache/logits"] = torch.cat([first, rest], dim=1)
    # Without its key/value cache: TL 3.5.1's cached greedy generate on a model without a
    # tokenizer departs from its own full forward after the first token (its uncached
    # generate and a full-forward loop agree); see docs/guide/porting.md.
    out["generate/greedy"] = model.generate(
        tokens[:1],
        max_new_tokens=4,
        do_sample=False,
        stop_at_eos=False,
        verbose=False,
        use_past_kv_cache=False,
    )
    _weight_methods(tl, out, model, tokens, n_layers)


def _weight_methods(tl: Any, out: dict, model: Any, tokens: torch.Tensor, n_layers: int) -> None:
    """The model's weight-side methods (composition, bias, circuits, `FactoredMatrix`) and
    the utilities, into `out`."""
    out["composition/Q"] = model.all_composition_scores("Q")
    out["composition/V"] = model.all_composition_scores("V")
    out["accumulated_bias/1"] = model.accumulated_bias(1)
    out["accumulated_bias/1/mlp_input"] = model.accumulated_bias(1, mlp_input=True)
    out["OV/S"] = model.OV[n_layers - 1, 0].S
    out["QK/eigenvalues"] = model.QK[0, 1].eigenvalues
    factored = tl.FactoredMatrix(model.W_Q[0, 0], model.W_K[0, 0].T)
    out["factored/AB"] = factored.AB
    out["factored/BA"] = factored.BA
    out["factored/norm"] = factored.norm()
    out["factored/svd"] = factored.svd()[1]
    out["factored/times_vector"] = factored @ model.W_E[1]
    out["factored/vector_times"] = model.W_E[2] @ factored
    # Each singular vector's sign is arbitrary: compare what it cancels from.
    collapsed_l, collapsed_r = factored.collapse_l(), factored.collapse_r()
    out["factored/collapse_l_gram"] = collapsed_l.T @ collapsed_l
    out["factored/collapse_r_gram"] = collapsed_r @ collapsed_r.T
    out["utils/get_act_name"] = [
        tl.utilities.get_act_name(*args)
        for args in [("k", 1, "a"), ("k1",), ("scale4ln1",), ("resid_pre", 0), ("pattern", 1)]
    ]
    logits = model(tokens)
    out["utils/loss"] = tl.utilities.lm_cross_entropy_loss(logits, tokens, per_token=True)
    out["n_params_total"] = sum(p.numel() for p in model.parameters())
    out["cfg/n_params"] = model.cfg.n_params


def cached_run(tl: Any, weights: dict, config: dict, tokens: torch.Tensor) -> dict[str, Any]:
    """`run_with_cache(tokens)` of a model of `config` holding `weights`: logits and cache."""
    model = tl.HookedTransformer(tl.HookedTransformerConfig(**config))
    model.load_state_dict(weights, strict=False)
    logits, cache = model.eval().run_with_cache(tokens)
    return {"logits": logits, "cache": dict(cache.cache_dict)}


def main() -> None:
    """`python scripts/tl_probes.py IN.pt OUT.pt`, with real TransformerLens importable."""
    import transformer_lens

    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    results = {"probes": probes(transformer_lens, given["weights"], given["config"])}
    results["cached_runs"] = {
        name: cached_run(transformer_lens, run["weights"], run["config"], run["tokens"])
        for name, run in given.get("cached_runs", {}).items()
    }
    namespace = {"weights": given["weights"], "config": given["config"]}
    exec(compile(given["demo"], "tl_main_demo.py", "exec"), namespace)
    results["demo"] = namespace["results"]
    results["version"] = importlib.metadata.version("transformer_lens")
    torch.save(results, target)


if __name__ == "__main__":
    main()
