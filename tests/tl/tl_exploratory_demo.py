# ruff: noqa: F821  (`weights`, `config` and `tokenizer_path` come from the caller)
# A TransformerLens 3.x script in the style of its Exploratory Analysis Demo (indirect
# object identification on GPT-2 small), written against TL's API, with GPT-2 replaced by a
# small random model of the same family and a BPE tokenizer saved in a local folder.
#
# tests/tl/test_tl_exploratory_demo.py runs this text unchanged under real TransformerLens
# 3.5.1 (in its own environment) and after `hookedattn_tl.install()` here, on the same
# weights, and compares `results` and every number it prints. The caller provides
# `weights` (a state dict), `config` (HookedTransformerConfig fields) and `tokenizer_path`
# (a folder `AutoTokenizer.from_pretrained` reads). Read as text, never imported.
from functools import partial

import einops
import torch
import transformer_lens.utilities as utils
from jaxtyping import Float
from transformer_lens import ActivationCache, HookedTransformer, HookedTransformerConfig
from transformers import AutoTokenizer

torch.set_grad_enabled(False)
results = {}

# GPT-2 small in the demo, from the hub, processed as TL's from_pretrained does.
model = HookedTransformer(
    HookedTransformerConfig(**config), AutoTokenizer.from_pretrained(tokenizer_path)
)
model.load_state_dict(weights, strict=False)
model.process_weights_(
    fold_ln=True,
    center_writing_weights=True,
    center_unembed=True,
    refactor_factored_attn_matrices=True,
)
model.set_use_attn_result(True)
# The refactored factors, where the SVD's signs do not show: column norms and biases.
results["W_Q_column_norms"] = model.W_Q.norm(dim=-2)
results["W_K_column_norms"] = model.W_K.norm(dim=-2)
results["W_V_column_norms"] = model.W_V.norm(dim=-2)
results["b_O"] = model.b_O
device = model.cfg.device

example_prompt = "After John and Mary went to the store, John gave a bottle of milk to"
example_answer = " Mary"
utils.test_prompt(example_prompt, example_answer, model, prepend_bos=True)

# --- Indirect object identification: prompts and answers
prompt_format = [
    "When John and Mary went to the shops,{} gave the bag to",
    "When Tom and James went to the park,{} gave the ball to",
    "When Dan and Sid went to the shops,{} gave an apple to",
    "After Martin and Amy went to the park,{} gave a drink to",
]
names = [(" Mary", " John"), (" Tom", " James"), (" Dan", " Sid"), (" Martin", " Amy")]
prompts, answers, answer_tokens = [], [], []
for i in range(len(prompt_format)):
    for j in range(2):
        answers.append((names[i][j], names[i][1 - j]))
        answer_tokens.append(
            (model.to_single_token(answers[-1][0]), model.to_single_token(answers[-1][1]))
        )
        prompts.append(prompt_format[i].format(answers[-1][1]))
answer_tokens = torch.tensor(answer_tokens).to(device)
print(prompts)
print(answers)
for prompt in prompts:
    str_tokens = model.to_str_tokens(prompt)
    print("Prompt length:", len(str_tokens))
    print("Prompt as tokens:", str_tokens)
results["answer_tokens"] = answer_tokens

tokens = model.to_tokens(prompts, prepend_bos=True)
original_logits, cache = model.run_with_cache(tokens)
results["tokens"] = tokens


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    return answer_logit_diff if per_prompt else answer_logit_diff.mean()


per_prompt_diff = logits_to_ave_logit_diff(original_logits, answer_tokens, per_prompt=True)
print("Per prompt logit difference:", per_prompt_diff.detach().cpu().round(decimals=3))
original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
print("Average logit difference:", round(original_average_logit_diff.item(), 3))
results["per_prompt_logit_diff"] = per_prompt_diff
results["original_average_logit_diff"] = original_average_logit_diff

# --- Direct logit attribution: the logit difference as a direction in the residual stream
W_U = model.unembed.W_U
answer_residual_directions = einops.rearrange(
    W_U[:, answer_tokens], "d_model batch correct_incorrect -> batch correct_incorrect d_model"
)
logit_diff_directions = answer_residual_directions[:, 0] - answer_residual_directions[:, 1]
print("Logit difference directions shape:", logit_diff_directions.shape)
final_residual_stream = cache["resid_post", -1]
final_token_residual_stream = final_residual_stream[:, -1, :]
scaled_final_token_residual_stream = cache.apply_ln_to_stack(
    final_token_residual_stream, layer=-1, pos_slice=-1
)
average_logit_diff = einops.einsum(
    scaled_final_token_residual_stream, logit_diff_directions, "batch d_model, batch d_model ->"
) / len(prompts)
print("Calculated average logit diff:", round(average_logit_diff.item(), 3))
print("Original logit difference:", round(original_average_logit_diff.item(), 3))
results["calculated_average_logit_diff"] = average_logit_diff


def residual_stack_to_logit_diff(
    residual_stack: Float[torch.Tensor, "components batch d_model"], cache: ActivationCache
) -> float:
    scaled_residual_stack = cache.apply_ln_to_stack(residual_stack, layer=-1, pos_slice=-1)
    return einops.einsum(
        scaled_residual_stack, logit_diff_directions, "... batch d_model, batch d_model -> ..."
    ) / len(prompts)


accumulated_residual, labels = cache.accumulated_resid(
    layer=-1, incl_mid=True, pos_slice=-1, return_labels=True
)
results["logit_lens_labels"] = labels
results["logit_lens_logit_diffs"] = residual_stack_to_logit_diff(accumulated_residual, cache)
per_layer_residual, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
results["per_layer_labels"] = labels
results["per_layer_logit_diffs"] = residual_stack_to_logit_diff(per_layer_residual, cache)
per_head_residual, labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
results["per_head_labels"] = labels
per_head_logit_diffs = einops.rearrange(
    residual_stack_to_logit_diff(per_head_residual, cache),
    "(layer head_index) -> layer head_index",
    layer=model.cfg.n_layers,
    head_index=model.cfg.n_heads,
)
results["per_head_logit_diffs"] = per_head_logit_diffs


def attention_patterns(heads, local_cache, batch_index=0):
    """What the demo hands to circuitsvis: the patterns of the heads (numbered layer-major)."""
    labels, patterns = [], []
    for head in heads:
        layer, head_index = divmod(int(head), model.cfg.n_heads)
        labels.append(f"L{layer}H{head_index}")
        patterns.append(local_cache["attn", layer][batch_index, head_index])
    return labels, torch.stack(patterns, dim=0)


top_k = 3
top_positive = torch.topk(per_head_logit_diffs.flatten(), k=top_k).indices
top_negative = torch.topk(-per_head_logit_diffs.flatten(), k=top_k).indices
results["top_positive_heads"] = attention_patterns(top_positive, cache)
results["top_negative_heads"] = attention_patterns(top_negative, cache)

# --- Activation patching by hand: clean activations into the corrupted run
corrupted_prompts = []
for i in range(0, len(prompts), 2):
    corrupted_prompts.append(prompts[i + 1])
    corrupted_prompts.append(prompts[i])
corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens, return_type="logits")
corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)
print("Corrupted Average Logit Diff", round(corrupted_average_logit_diff.item(), 2))
print("Clean Average Logit Diff", round(original_average_logit_diff.item(), 2))
print(model.to_string(corrupted_tokens))


def patch_residual_component(corrupted_residual_component, hook, pos, clean_cache):
    clean_value = clean_cache[hook.name][:, pos, :].clone()
    corrupted_residual_component = corrupted_residual_component.clone()
    corrupted_residual_component[:, pos : pos + 1, :] = clean_value.unsqueeze(1)
    return corrupted_residual_component


def normalize_patched_logit_diff(patched_logit_diff):
    return (patched_logit_diff - corrupted_average_logit_diff) / (
        original_average_logit_diff - corrupted_average_logit_diff
    )


def patch_every_position(act_name):
    patched = torch.zeros(model.cfg.n_layers, tokens.shape[1], device=device)
    for layer in range(model.cfg.n_layers):
        for position in range(tokens.shape[1]):
            hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
            patched_logits = model.run_with_hooks(
                corrupted_tokens,
                fwd_hooks=[(utils.get_act_name(act_name, layer), hook_fn)],
                return_type="logits",
            )
            patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)
            patched[layer, position] = normalize_patched_logit_diff(patched_logit_diff)
    return patched


results["patched_residual_stream_diff"] = patch_every_position("resid_pre")
results["patched_attn_diff"] = patch_every_position("attn_out")
results["patched_mlp_diff"] = patch_every_position("mlp_out")
results["prompt_position_labels"] = [
    f"{tok}_{i}" for i, tok in enumerate(model.to_str_tokens(tokens[0]))
]


def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
    clean_value = clean_cache[hook.name][:, :, head_index, :].clone()
    corrupted_head_vector = corrupted_head_vector.clone()
    corrupted_head_vector[:, :, head_index : head_index + 1, :] = clean_value.unsqueeze(2)
    return corrupted_head_vector


def patch_head_pattern(corrupted_head_pattern, hook, head_index, clean_cache):
    clean_value = clean_cache[hook.name][:, head_index, :, :].clone()
    corrupted_head_pattern = corrupted_head_pattern.clone()
    corrupted_head_pattern[:, head_index : head_index + 1, :, :] = clean_value.unsqueeze(1)
    return corrupted_head_pattern


def patch_every_head(act_name, patch):
    patched = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, device=device)
    for layer in range(model.cfg.n_layers):
        for head_index in range(model.cfg.n_heads):
            hook_fn = partial(patch, head_index=head_index, clean_cache=cache)
            patched_logits = model.run_with_hooks(
                corrupted_tokens,
                fwd_hooks=[(utils.get_act_name(act_name, layer, "attn"), hook_fn)],
                return_type="logits",
            )
            patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)
            patched[layer, head_index] = normalize_patched_logit_diff(patched_logit_diff)
    return patched


patched_head_z_diff = patch_every_head("z", patch_head_vector)
results["patched_head_z_diff"] = patched_head_z_diff
results["patched_head_v_diff"] = patch_every_head("v", patch_head_vector)
results["patched_head_attn_diff"] = patch_every_head("attn", patch_head_pattern)


# --- Direct path patching: head A's clean output, through B's input weights only
def patch_direct_path_A_output_to_B_attn_act(
    corrupted_attn_act, hook, attn_act_type, A_layer, A_head_index, B_layer, B_head_index
):
    A_output_act_name = utils.get_act_name("result", A_layer, "attn")
    clean_A_output = cache[A_output_act_name][:, :, A_head_index, :]
    corrupted_A_output = corrupted_cache[A_output_act_name][:, :, A_head_index, :]
    corrupted_B_act = corrupted_attn_act[:, :, B_head_index, :]
    W_B = getattr(model.blocks[B_layer].attn, "W_" + attn_act_type.upper())[B_head_index]
    corrupted_ln1_scale = corrupted_cache[utils.get_act_name("scale", B_layer, "ln1")]
    patched_B_act = (
        corrupted_B_act + (clean_A_output - corrupted_A_output) @ W_B / corrupted_ln1_scale
    )
    patched_attn_act = corrupted_attn_act.clone()
    patched_attn_act[:, :, B_head_index, :] = patched_B_act
    return patched_attn_act


def direct_path_output_to_attn_act_diffs(output_layer, attn_act_layer, attn_act_type):
    A_to_B_diffs = torch.zeros(model.cfg.n_heads, model.cfg.n_heads, device=device)
    for A in range(model.cfg.n_heads):
        for B in range(model.cfg.n_heads):
            patch_hook = (
                utils.get_act_name(attn_act_type, attn_act_layer, "attn"),
                partial(
                    patch_direct_path_A_output_to_B_attn_act,
                    attn_act_type=attn_act_type,
                    A_layer=output_layer,
                    A_head_index=A,
                    B_layer=attn_act_layer,
                    B_head_index=B,
                ),
            )
            patched_logits = model.run_with_hooks(
                corrupted_tokens, fwd_hooks=[patch_hook], return_type="logits"
            )
            patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)
            A_to_B_diffs[A, B] = normalize_patched_logit_diff(patched_logit_diff)
    return A_to_B_diffs


for output_layer, attn_act_layer, attn_act_type in [(0, 2, "v"), (1, 2, "q"), (0, 1, "k")]:
    results[f"direct_path_L{output_layer}_to_L{attn_act_layer}{attn_act_type}"] = (
        direct_path_output_to_attn_act_diffs(output_layer, attn_act_layer, attn_act_type)
    )

top_heads_by_output_patch = torch.topk(patched_head_z_diff.abs().flatten(), k=4).indices
results["top_heads_by_output_patch"] = attention_patterns(top_heads_by_output_patch, cache)

# --- Induction heads: text repeated, then previous-token, duplicate and induction scores
example_text = "Research in interpretability seeks to explain the behaviour of models."
example_repeated_tokens = model.to_tokens(example_text + example_text, prepend_bos=True)
example_repeated_logits, example_repeated_cache = model.run_with_cache(example_repeated_tokens)
results["example_induction_patterns"] = attention_patterns([5, 9], example_repeated_cache)

seq_len = 12
batch_size = 2
prev_token_scores = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=device)
duplicate_token_scores = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=device)
induction_scores = torch.zeros((model.cfg.n_layers, model.cfg.n_heads), device=device)


def score_hook(pattern, hook, scores, offset):
    diagonal = pattern.diagonal(offset=offset, dim1=-1, dim2=-2)
    scores[hook.layer()] = einops.reduce(
        diagonal, "batch head_index diagonal -> head_index", "mean"
    )


torch.manual_seed(0)
original_tokens = torch.randint(1, model.cfg.d_vocab, size=(batch_size, seq_len)).to(device)
repeated_tokens = einops.repeat(original_tokens, "batch seq_len -> batch (2 seq_len)")
pattern_filter = lambda act_name: act_name.endswith("hook_pattern")
loss = model.run_with_hooks(
    repeated_tokens,
    return_type="loss",
    fwd_hooks=[
        (pattern_filter, partial(score_hook, scores=prev_token_scores, offset=1)),
        (pattern_filter, partial(score_hook, scores=duplicate_token_scores, offset=seq_len)),
        (pattern_filter, partial(score_hook, scores=induction_scores, offset=seq_len - 1)),
    ],
)
print(torch.round(utils.get_corner(prev_token_scores).detach().cpu(), decimals=3))
print(torch.round(utils.get_corner(duplicate_token_scores).detach().cpu(), decimals=3))
print(torch.round(utils.get_corner(induction_scores).detach().cpu(), decimals=3))
results["repeated_loss"] = loss
results["prev_token_scores"] = prev_token_scores
results["duplicate_token_scores"] = duplicate_token_scores
results["induction_scores"] = induction_scores

# --- Ablating the top name mover: its output at the last position set to zero
top_name_mover = per_head_logit_diffs.flatten().argmax().item()
top_name_mover_layer = top_name_mover // model.cfg.n_heads
top_name_mover_head = top_name_mover % model.cfg.n_heads
print(f"Top Name Mover to ablate: L{top_name_mover_layer}H{top_name_mover_head}")


def ablate_top_head_hook(z: Float[torch.Tensor, "batch pos head_index d_head"], hook):
    z = z.clone()
    z[:, -1, top_name_mover_head, :] = 0
    return z


model.blocks[top_name_mover_layer].attn.hook_z.add_hook(ablate_top_head_hook)
ablated_logits, ablated_cache = model.run_with_cache(tokens)
model.reset_hooks()
ablated_logit_diff = logits_to_ave_logit_diff(ablated_logits, answer_tokens)
top_attribution = per_head_logit_diffs.flatten()[top_name_mover].item()
print(f"Original logit diff: {original_average_logit_diff:.2f}")
print(f"Post ablation logit diff: {ablated_logit_diff.item():.2f}")
print(f"Direct Logit Attribution of top name mover head: {top_attribution:.2f}")
print(
    "Naive prediction of post ablation logit diff: "
    f"{original_average_logit_diff - top_attribution:.2f}"
)
results["ablated_logit_diff"] = ablated_logit_diff
per_head_ablated_residual, labels = ablated_cache.stack_head_results(
    layer=-1, pos_slice=-1, return_labels=True
)
results["per_head_ablated_logit_diffs"] = residual_stack_to_logit_diff(
    per_head_ablated_residual, ablated_cache
).reshape(model.cfg.n_layers, model.cfg.n_heads)
scale_ratio = cache["ln_final.hook_scale"][:, -1] / ablated_cache["ln_final.hook_scale"][:, -1]
print("Average LN scaling ratio:", round(scale_ratio.mean().item(), 3))
print(
    "Ablation LN scale",
    ablated_cache["ln_final.hook_scale"][:, -1].detach().cpu().round(decimals=2),
)
print("Original LN scale", cache["ln_final.hook_scale"][:, -1].detach().cpu().round(decimals=2))
results["ablated_ln_scale"] = ablated_cache["ln_final.hook_scale"][:, -1]
results["version_module"] = utils.__name__
