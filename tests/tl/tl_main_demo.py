# ruff: noqa: F821  (`weights` and `config` come from the caller)
# A TransformerLens 3.x script in the style of its Main Demo, written against TL's API.
#
# tests/tl/test_tl_main_demo.py runs this text with its one import line changed to
# `import hookedattn_tl as transformer_lens`; tests/tl/test_tl_vs_transformer_lens.py runs
# it unchanged under real TransformerLens too, on the same weights, and compares
# `results`. The caller provides `weights` (a state dict) and `config` (a dict of
# HookedTransformerConfig fields). Not a test module: it is read as text, never imported.
import einops
import torch
import transformer_lens
from transformer_lens import HookedTransformer, HookedTransformerConfig, patching, utils

results = {}
cfg = HookedTransformerConfig(**config)
model = HookedTransformer(cfg)
model.load_state_dict(weights, strict=False)
model.eval()

generator = torch.Generator().manual_seed(0)
tokens = torch.randint(1, cfg.d_vocab, (4, 12), generator=generator)
corrupted_tokens = tokens.clone()
corrupted_tokens[:, 3] = (tokens[:, 3] + 7) % cfg.d_vocab
answer_tokens = torch.stack([tokens[:, -1], corrupted_tokens[:, -2]], dim=1)

# --- Caching all activations
logits, cache = model.run_with_cache(tokens)
results["loss"] = model(tokens, return_type="loss").item()
results["pattern_L0"] = cache["pattern", 0, "attn"]
results["pattern_L1_full_name"] = cache["blocks.1.attn.hook_pattern"]
results["k1"] = cache["k1"]
results["scale_ln1_L1"] = cache[utils.get_act_name("scale", 1, "ln1")]


def logit_diff(logits, answer_tokens=answer_tokens, per_prompt=False):
    final = logits[:, -1, :]
    answer_logits = final.gather(dim=-1, index=answer_tokens)
    diff = answer_logits[:, 0] - answer_logits[:, 1]
    return diff if per_prompt else diff.mean()


results["logit_diff"] = logit_diff(logits).item()

# --- Residual stream decomposition and direct logit attribution
answer_residual_directions = model.tokens_to_residual_directions(answer_tokens)
logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]


def residual_stack_to_logit_diff(residual_stack, cache):
    scaled = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
    return einops.einsum(
        scaled, logit_diff_directions, "... batch d_model, batch d_model -> ..."
    ) / len(tokens)


accumulated, labels = cache.accumulated_resid(
    layer=-1, incl_mid=True, pos_slice=-1, return_labels=True
)
results["accumulated_labels"] = labels
results["accumulated"] = accumulated
results["logit_lens_logit_diffs"] = residual_stack_to_logit_diff(accumulated, cache)
lens, _ = cache.accumulated_resid(layer=-1, pos_slice=-1, apply_ln=True, return_labels=True)
results["logit_lens_logits"] = lens @ model.W_U + model.b_U
results["last_logits"] = logits[:, -1]

per_layer, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
results["decompose_labels"] = labels
results["decompose"] = per_layer
results["per_layer_logit_diffs"] = residual_stack_to_logit_diff(per_layer, cache)

per_head = cache.stack_head_results(layer=-1, pos_slice=-1)
per_head = einops.rearrange(per_head, "(layer head) ... -> layer head ...", layer=cfg.n_layers)
results["per_head_logit_diffs"] = residual_stack_to_logit_diff(per_head, cache)
results["logit_attrs"] = cache.logit_attrs(
    per_layer, answer_tokens[:, 0], answer_tokens[:, 1], pos_slice=-1
)
full, full_labels = cache.get_full_resid_decomposition(
    layer=-1, expand_neurons=False, pos_slice=-1, return_labels=True
)
results["full_decomposition_labels"] = full_labels
results["full_decomposition"] = full
neurons = cache.stack_neuron_results(layer=cfg.n_layers, pos_slice=-1)
results["neuron_results_norm"] = neurons.norm(dim=-1)


# --- Ablation: zero one head's output and see the loss change
def ablate_head(z, hook, head=1):
    z[:, :, head, :] = 0.0
    return z


results["ablated_loss"] = model.run_with_hooks(
    tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("z", 0), ablate_head)]
).item()

# --- Activation patching, TransformerLens's argument order
corrupted_logits = model(corrupted_tokens)
clean_diff, corrupted_diff = logit_diff(logits), logit_diff(corrupted_logits)


def metric(patched_logits):
    return (logit_diff(patched_logits) - corrupted_diff) / (clean_diff - corrupted_diff)


results["patch_resid_pre"] = patching.get_act_patch_resid_pre(
    model, corrupted_tokens, cache, metric
)
results["patch_head_all_pos"] = patching.get_act_patch_attn_head_out_all_pos(
    model, corrupted_tokens, cache, metric
)
results["patch_block_every"] = patching.get_act_patch_block_every(
    model, corrupted_tokens, cache, metric
)
results["patch_head_by_pos"] = patching.get_act_patch_attn_head_out_by_pos(
    model, corrupted_tokens, cache, metric
)

# --- Induction heads: repeated random tokens, scores from the attention patterns
seq_len = 6
random_tokens = torch.randint(1, cfg.d_vocab, (2, seq_len), generator=generator)
repeated = torch.cat([random_tokens, random_tokens], dim=1)
induction_scores = torch.zeros(cfg.n_layers, cfg.n_heads)


def induction_score_hook(pattern, hook):
    stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    induction_scores[hook.layer()] = einops.reduce(stripe, "batch head position -> head", "mean")


model.run_with_hooks(
    repeated,
    return_type=None,
    fwd_hooks=[(lambda name: name.endswith("pattern"), induction_score_hook)],
)
results["induction_scores"] = induction_scores

# --- Circuits: the OV circuit of one head, factored
OV = model.OV[1, 0]
results["OV_singular_values"] = OV.S
results["OV_norm"] = OV.norm()
results["version_module"] = transformer_lens.__name__
