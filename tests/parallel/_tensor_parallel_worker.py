"""Run under `torchrun --nproc_per_node 2` by tests/parallel/test_tensor_parallel.py: every
check of a tensor-parallel model against the one-process model it was split from, on each
rank.

Each rank builds the same seeded one-process model (the reference), splits a copy over the
two ranks, runs the same inputs through both and writes `<out>/rank<r>.json`: for every
case and check, the largest difference from the reference relative to the reference's
scale (`max|a - b| / max(1, max|b|)`), or a boolean. The test asserts on the numbers, so
that a failure names the case and the check. Then it loads the checkpoints named on the
command line (HF directories, then one of ours) with `tp_size=2` and in one process, and
writes `<out>/loading<r>.json`.
"""

import copy
import json
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)

from analysis import activation_patch  # noqa: E402
from hookedattn import HookedTransformer  # noqa: E402
from hookedattn.core import parallel  # noqa: E402
from hookedattn.core.mixer_config import MixerConfig  # noqa: E402
from hookedattn.core.parallel import _mixers as parallel_mixers  # noqa: E402
from hookedattn.sae import SAEConfig, SparseAutoencoder  # noqa: E402
from hookedattn.testing import random_tiny_model, random_tokens  # noqa: E402

HYBRID = dict(normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
              act_fn="silu")  # fmt: skip
MIXER_SIZES = dict(d_conv=3, n_ssm_heads=4, d_ssm_head=6, d_state=5, n_ssm_groups=2)
KIMI = dict(d_conv=3, n_ssm_heads=4, d_ssm_head=6)
LATENT = dict(n_heads=4, d_head=12, d_head_v=8, kv_lora_rank=16, q_lora_rank=20, rotary_dim=4,
              **HYBRID)  # fmt: skip
CASES = {
    # LayerNorm, learned positions, GELU; a vocabulary of 33 is cut 17 + 16.
    "gpt2_like": dict(d_vocab=33, act_fn="gelu_new", use_attn_result=True),
    # RMSNorm, rotary, grouped keys and values (4 query heads, 2 key/value heads), SwiGLU.
    "llama_like": dict(
        n_key_value_heads=2, normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, act_fn="silu",
    ),
    # Per-head q/k/v input copies (grouped), a parallel block, hook_mlp_in.
    "split_inputs": dict(
        n_key_value_heads=2, use_split_qkv_input=True, use_hook_mlp_in=True,
        parallel_attn_mlp=True,
    ),
    # float32, fused kernels where nothing reads the pattern, per-head q/k norms (Qwen 3).
    "float32_fused": dict(
        dtype=torch.float32, use_fused_kernels=True, n_key_value_heads=2,
        positional_embedding_type="rotary", normalization_type="RMS", use_qk_norm=True,
        qk_norm_per_head=True,
    ),
    # TransformerLens's toy models: shortformer positions (every layer's queries and keys).
    "shortformer": dict(positional_embedding_type="shortformer"),
    # Hybrids: a gated delta net, a Mamba-2 mixer, a short convolution and an RG-LRU in
    # attention's place (Qwen3.5, Bamba, LFM2, RecurrentGemma), and a Mamba-2 mixer of one
    # group beside the attention (Falcon-H1; its gated norm spans the ranks); the gated delta
    # net and the Mamba-2 mixers are split by heads, the short convolution by channels, the
    # RG-LRU runs whole on each rank.
    "hybrid": dict(**HYBRID, n_layers=6, mixers=MixerConfig(
        layers=("attention", "attention", "gated_delta", "mamba2", "short_conv", "rg_lru"),
        **MIXER_SIZES)),
    "hybrid_beside": dict(**HYBRID, mixers=MixerConfig(
        layers=("attention",) * 2, beside_attention="mamba2", **MIXER_SIZES | {"n_ssm_groups": 1})),
    # Latent attention (DeepSeek V3's, with a query latent, a dense block, then a mixture
    # of experts; Bailing Hybrid's output gate on each head), its heads split, its latents
    # whole on every rank.
    "latent": LATENT | dict(num_experts=4, experts_per_token=2, d_mlp=8, n_dense_layers=1,
                            d_mlp_dense=12),
    # DeepSeek V3.2's lightning indexer: each query reads the 3 keys it picks, on every rank.
    "latent_indexed": LATENT | dict(index_topk=3, index_n_heads=4, index_head_dim=8),
    "latent_gated": LATENT | dict(q_lora_rank=None, attn_gate="sigmoid",
                                  attn_gate_per_head=True),
    # Jamba's and Falcon Mamba's Mamba-1 mixer (normed B, C and step), split by channels.
    "hybrid_mamba": dict(**HYBRID, n_layers=3, mixers=MixerConfig(
        layers=("attention", "attention", "mamba"), d_conv=3, n_ssm_heads=12, d_ssm_head=1,
        d_state=5, dt_rank=3, bcdt_norm=True)),
    # Kimi Linear: latent attention and Kimi Delta Attention (low-rank gates); and Bailing
    # Hybrid's full-rank gates and bounded decay, beside a gate on each latent head.
    "hybrid_kimi": LATENT | dict(n_layers=3, mixers=MixerConfig(
        layers=("attention", "attention", "kimi_delta"), dt_rank=3, **KIMI)),
    "hybrid_bailing": LATENT | dict(n_layers=3, attn_gate="sigmoid", attn_gate_per_head=True,
        mixers=MixerConfig(layers=("attention", "attention", "kimi_delta"),
                           kda_full_rank_gates=True, kda_decay_bound=-5.0, **KIMI)),
    # Mixtures of experts, each expert's neurons split: softmax routing; DeepSeek V3's
    # grouped sigmoid routing with a gated shared expert, in float32 (the experts' grouped
    # products where nothing is hooked).
    "moe": dict(**HYBRID, num_experts=6, experts_per_token=2, d_mlp=8),
    "moe_float32": dict(**HYBRID, num_experts=6, experts_per_token=2, d_mlp=8,
        d_mlp_shared=10, shared_expert_gate=True, router_scoring="sigmoid", n_expert_groups=2,
        topk_expert_groups=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        dtype=torch.float32),
}  # fmt: skip


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    return float((a.double() - b.double()).abs().max()) / scale if b.numel() else 0.0


def worst(pairs) -> float:
    return max((relative(a, b) for a, b in pairs), default=0.0)


def check(ref, model) -> dict:
    cfg, out = ref.cfg, {}
    tokens = random_tokens(cfg.d_vocab, batch=2, pos=7, seed=3)
    corrupted = tokens.clone()
    corrupted[:, 2] = (tokens[:, 2] + 5) % cfg.d_vocab

    out["parameter_fraction"] = sum(p.numel() for p in model.parameters()) / sum(
        p.numel() for p in ref.parameters()
    )
    # A hybrid's weights of every layer are refused (its mixers have no heads).
    views = ("W_E", "W_U") if cfg.mixers else ("W_Q", "W_K", "W_V", "W_O", "W_E", "W_U")
    out["weight_views"] = worst((getattr(model, w), getattr(ref, w)) for w in views)
    if cfg.mixers:
        out.update(check_mixers(ref, model, tokens))
    if cfg.is_moe:
        out.update(check_experts(ref, model, tokens))
    if cfg.is_latent_attention:
        out.update(check_latents(ref, model))
    whole = ref.state_dict()
    out["dtensor_state_dict"] = all(
        torch.equal(t.full_tensor(), whole[n])
        for n, t in parallel.dtensor_state_dict(model).items()
    )
    out["logits"] = relative(model(tokens), ref(tokens))
    (ref_logits, ref_cache), (logits, cache) = (
        ref.run_with_cache(tokens),
        model.run_with_cache(tokens),
    )
    out["cache_names"] = sorted(cache.keys()) == sorted(ref_cache.keys())
    out["cache"] = worst((cache[k], ref_cache[k]) for k in ref_cache)
    out["cached_logits"] = relative(logits, ref_logits)

    def zero_head_3(z, hook):  # head 3 lives on rank 1
        z[:, :, 3] = 0.0

    def double_pattern(pattern, hook):
        return pattern * 2.0

    hooks = [("blocks.0.attn.hook_z", zero_head_3), ("blocks.1.attn.hook_pattern", double_pattern)]
    edited = ref.run_with_hooks(tokens, fwd_hooks=hooks)
    out["hook_edit"] = relative(model.run_with_hooks(tokens, fwd_hooks=hooks), edited)
    out["hook_edit_changes_logits"] = relative(edited, ref_logits) > 1e-3

    metric = lambda logits: logits[:, -1, 1] - logits[:, -1, 0]
    for kind in ("z", "resid_pre", "v", "pattern"):
        kwargs = dict(clean_tokens=tokens, corrupted_tokens=corrupted, metric=metric)
        expected = activation_patch(ref, kind, **kwargs).per_prompt
        out[f"patch_{kind}"] = relative(
            activation_patch(model, kind, **kwargs).per_prompt, expected
        )
    kwargs = dict(clean_tokens=tokens, corrupted_tokens=corrupted, metric=metric)
    declared = activation_patch(ref, "v", metric_positions=-1, by_pos=True, **kwargs).per_prompt
    got = activation_patch(model, "v", metric_positions=-1, by_pos=True, **kwargs).per_prompt
    out["patch_v_by_pos_declared"] = relative(got, declared)
    # A budget of one byte runs every variant alone: each declared position runs again
    # through the last block, against keys that mix the cache's and the pass's.
    one_at_a_time = dict(metric_positions=-1, by_pos=True, memory_budget=1, **kwargs)
    got = activation_patch(model, "v", **one_at_a_time).per_prompt
    out["patch_v_by_pos_one_at_a_time"] = relative(got, declared)

    # Gradient methods: tests/parallel/test_gradient_methods.py.
    for use_past_kv_cache in (True, False):
        kwargs = dict(max_new_tokens=6, stop_at_eos=False, use_past_kv_cache=use_past_kv_cache)
        same = torch.equal(model.generate(tokens, **kwargs), ref.generate(tokens, **kwargs))
        out[f"generate_kv_cache_{use_past_kv_cache}"] = same

    if not cfg.attn_only and not cfg.is_moe:  # a mixture has no blocks.L.mlp.hook_post
        sae = SparseAutoencoder(
            SAEConfig(d_in=cfg.d_mlp, d_sae=24, hook_name="blocks.1.mlp.hook_post",
                      dtype=str(cfg.dtype).removeprefix("torch."))
        )  # fmt: skip
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in sae.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        with ref.saes([sae], use_error_term=False):
            spliced_ref, sae_cache_ref = ref.run_with_cache(tokens)
        with model.saes([sae], use_error_term=False):
            spliced, sae_cache = model.run_with_cache(tokens)
        out["sae_splice"] = relative(spliced, spliced_ref)
        name = "blocks.1.mlp.hook_post.sae.hook_acts"
        out["sae_acts"] = relative(sae_cache[name], sae_cache_ref[name])
        out["sae_changes_logits"] = relative(spliced_ref, ref_logits) > 1e-3

    with parallel.local_activations(model):
        _, local = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_z")
    part = model.hook_dict["blocks.0.attn.hook_z"].local_slice
    whole = ref_cache["blocks.0.attn.hook_z"]
    out["local_z"] = relative(
        local["blocks.0.attn.hook_z"], whole.narrow(part.axis, part.start, part.length)
    )
    out["local_z_heads"] = [part.start, part.stop]

    loss_ref, grads_ref = ref.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    loss, grads = model.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    out["loss"] = relative(loss, loss_ref)
    gradient_names = [k for k in grads_ref if k.endswith("_grad")]
    out["gradient_names"] = sorted(gradient_names) == sorted(
        k for k in grads if k.endswith("_grad")
    )
    out["gradients"] = worst((grads[k], grads_ref[k]) for k in gradient_names)
    return out


def check_mixers(ref, model, tokens) -> dict:
    """A hybrid's mixers: gated delta nets and Mamba-2 mixers split by heads (each
    parameter of theirs this rank's slice or whole: `dtensor_state_dict`), every other
    mixer whole on every rank, its parameters the reference's; the rest about halved; edits
    inside the mixers (a gated delta net's steps, a Mamba-2 mixer's mixing matrix, every
    mixer's write) as in one process."""
    mixers = ref.cfg.mixers
    kinds = {i: kind for i in range(ref.cfg.n_layers) for kind in mixers.layer_mixers(i)}
    split = {i: kind for i, kind in kinds.items() if kind in parallel_mixers.SPLIT}
    whole_params = dict(ref.named_parameters())
    unsplit = tuple(f"blocks.{i}.mixer." for i in kinds if i not in split)
    whole = {n: p for n, p in model.named_parameters() if n.startswith(unsplit)}
    out = {"mixers_whole": all(torch.equal(p, whole_params[n]) for n, p in whole.items())}
    out["mixers_run_whole"] = sorted({kinds[i] for i in kinds if i not in split})
    slices = parallel.parameter_slices(model)
    out["mixers_split"] = all(f"blocks.{i}.mixer.W_out" in slices for i in split)
    out["mixers_split_kinds"] = sorted(set(split.values()))
    prefixes = tuple(f"blocks.{i}.mixer." for i in split)
    out["parameter_fraction_split_mixers"] = _fraction(model, whole_params, prefixes)
    rest = [(p.numel(), whole_params[n].numel())
            for n, p in model.named_parameters() if n not in whole]  # fmt: skip
    out["parameter_fraction_beside_mixers"] = sum(a for a, _ in rest) / sum(b for _, b in rest)
    hooks = [(f"blocks.{i}.mixer.hook_out", lambda write, hook: write * 0.5) for i in kinds]
    hooks += [(f"blocks.{i}.mixer.hook_beta", lambda beta, hook: beta * 0.3)
              for i, kind in split.items() if kind in ("gated_delta", "kimi_delta")]  # fmt: skip
    hooks += [(f"blocks.{i}.mixer.hook_mixing", lambda mixing, hook: mixing * 0.7)
              for i, kind in split.items() if kind == "mamba2"]  # fmt: skip
    edited = ref.run_with_hooks(tokens, fwd_hooks=hooks)
    out["mixer_edit"] = relative(model.run_with_hooks(tokens, fwd_hooks=hooks), edited)
    out["mixer_edit_changes_logits"] = relative(edited, ref(tokens)) > 1e-3
    return out


def _fraction(model, whole_params: dict, prefixes: tuple[str, ...]) -> float:
    """The share of the parameters under `prefixes` this rank holds."""
    held = [(p.numel(), whole_params[n].numel())
            for n, p in model.named_parameters() if n.startswith(prefixes)]  # fmt: skip
    return sum(a for a, _ in held) / sum(b for _, b in held)


def check_latents(ref, model) -> dict:
    """Latent attention: the latents' maps whole on every rank, each head's expansion of
    them and its write this rank's slice."""
    whole, slices = dict(ref.named_parameters()), parallel.parameter_slices(model)
    latent = ("W_Q_a", "W_KV_a", "W_K_rope", "q_a_norm.w", "kv_a_norm.w")
    mine = {n: p for n, p in model.named_parameters() if n.endswith(latent)}
    split = [f"blocks.{i}.attn.{w}" for i in ref.cfg.attention_layers
             for w in ("W_Q", "W_KV_b", "W_O")]  # fmt: skip
    return {"latents_whole": bool(mine) and all(torch.equal(p, whole[n]) for n, p in mine.items())
            and not set(mine) & set(slices),
            "heads_split": all(name in slices for name in split)}  # fmt: skip


def check_experts(ref, model, tokens) -> dict:
    """A mixture of experts with each expert's neurons split: the routing whole on every
    rank, an edit of one expert's neurons as in one process."""
    out = {}
    for point in ("hook_router_logits", "hook_expert_indices", "hook_expert_weights"):
        _, cache = model.run_with_cache(tokens, names_filter=f"blocks.1.mlp.{point}")
        _, ref_cache = ref.run_with_cache(tokens, names_filter=f"blocks.1.mlp.{point}")
        out[f"routing_{point}"] = relative(
            *(c[f"blocks.1.mlp.{point}"] for c in (cache, ref_cache))
        )

    def zero_neuron_5(post, hook):  # neuron 5 of each expert lives on rank 1
        post[:, 5] = 0.0

    views = []
    if not ref.cfg.n_dense_layers:  # blocks alike: stacked `[layer expert ...]`
        views += [(model.W_in, ref.W_in), (model.W_out, ref.W_out)]
    else:  # a dense first block `d_mlp_dense` wide (DeepSeek's): its own
        views += [(model.layer_weight(0, "mlp", w), ref.layer_weight(0, "mlp", w))
                  for w in ("W_in", "W_out")]  # fmt: skip
    views += [(model.layer_weight(1, "mlp", w), ref.layer_weight(1, "mlp", w))
              for w in ("W_gate", "b_in", "W_out", "b_out", "W_router")]  # fmt: skip
    out["expert_weight_views"] = worst(views)
    hooks = [(f"blocks.1.mlp.experts.{e}.hook_post", zero_neuron_5) for e in range(3)]
    edited = ref.run_with_hooks(tokens, fwd_hooks=hooks)
    out["expert_edit"] = relative(model.run_with_hooks(tokens, fwd_hooks=hooks), edited)
    out["expert_edit_changes_logits"] = relative(edited, ref(tokens)) > 1e-4
    return out


def check_loaded(one, model) -> dict:
    """A model loaded with `tp_size=2` against the same checkpoint loaded in one process:
    every parameter is exactly this rank's slice of the whole, and it runs the same."""
    whole = one.state_dict()
    slices = parallel.parameter_slices(model)
    exact = all(
        torch.equal(t, whole[n] if n not in slices else whole[n].narrow(
            slices[n].axis, slices[n].start, slices[n].length))
        for n, t in model.state_dict().items()
    )  # fmt: skip
    tokens = random_tokens(one.cfg.d_vocab, batch=2, pos=6, seed=4)
    (ref_logits, ref_cache), (logits, cache) = (
        one.run_with_cache(tokens),
        model.run_with_cache(tokens),
    )
    return {
        "slices_exact": exact,
        "sharded_parameters": len(slices),
        "logits": relative(logits, ref_logits),
        "cache": worst((cache[k], ref_cache[k]) for k in ref_cache),
        "parameter_fraction": sum(p.numel() for p in model.parameters())
        / sum(p.numel() for p in one.parameters()),
    }


def loading(out_dir: Path, hf_dirs: list[str], ours: str) -> dict:
    results = {}
    for path in hf_dirs:
        one = HookedTransformer.from_hf(path, dtype=torch.float64)
        model = HookedTransformer.from_hf(path, dtype=torch.float64, tp_size=2)
        results[f"from_hf {Path(path).name}"] = check_loaded(one, model)
    one, model = HookedTransformer.load(ours), HookedTransformer.load(ours, tp_size=2)
    results["load"] = check_loaded(one, model)
    model.save(out_dir / "saved")  # every rank calls it; rank 0 writes the whole model
    saved = HookedTransformer.load(out_dir / "saved")
    results["load"]["saved_whole"] = all(
        torch.equal(t, one.state_dict()[n]) for n, t in saved.state_dict().items()
    )
    try:
        HookedTransformer.load(ours, tp_size=4)
        results["load"]["tp_size_4"] = "loaded"
    except ValueError as error:
        results["load"]["tp_size_4"] = str(error)
    return results


def main(out_dir: str, hf_dirs: list[str], ours: str) -> None:
    group = parallel.tensor_parallel_group(2)
    results = {}
    for name, fields in CASES.items():
        start = time.perf_counter()
        ref = random_tiny_model(**fields)
        model = parallel.tensor_parallel(copy.deepcopy(ref), group)
        results[name] = check(ref, model)
        results[name]["seconds"] = time.perf_counter() - start
    path = Path(out_dir) / f"rank{group.rank}.json"
    path.write_text(json.dumps(results, indent=1))
    loaded = loading(Path(out_dir), hf_dirs, ours)
    (Path(out_dir) / f"loading{group.rank}.json").write_text(json.dumps(loaded, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:-1], sys.argv[-1])
