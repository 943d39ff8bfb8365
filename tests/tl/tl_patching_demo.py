# ruff: noqa: F821, N816  (the weights, configs, tokenizer folder come from the caller)
# A TransformerLens 3.x script in the style of its activation-patching demo
# (Activation_Patching_in_TL_Demo: `transformer_lens.patching` on indirect object
# identification with GPT-2 small, then on induction with attn-only-2l), written against
# TL's API, with both hub models replaced by small random models of the same families and
# a BPE tokenizer saved in a local folder.
#
# tests/tl/test_tl_patching_demo.py runs this text unchanged under real TransformerLens 3.5.1
# (in its own environment) and after `hookedattn_tl.install()` here, on the same weights,
# and compares `results` and every number it prints. The caller provides `weights` and
# `config` (the GPT-2-style model), `attn_only_weights` and `attn_only_config` (the
# attention-only one) and `tokenizer_path`. Read as text, never imported.
import einops
import torch
import transformer_lens
import transformer_lens.patching as patching
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformers import AutoTokenizer

torch.set_grad_enabled(False)
results = {}


def imshow(tensor, **kwargs):
    """The demo's plots (neel_plotly): each one's tensor is kept, by title."""
    results[kwargs["title"]] = tensor


tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
model = HookedTransformer(HookedTransformerConfig(**config), tokenizer)
model.load_state_dict(weights, strict=False)
model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)

# --- Indirect object identification: clean prompts, corrupted by swapping each pair
prompts = [
    "When John and Mary went to the shops, John gave the bag to",
    "When John and Mary went to the shops, Mary gave the bag to",
    "When Tom and James went to the park, James gave the ball to",
    "When Tom and James went to the park, Tom gave the ball to",
    "When Dan and Sid went to the shops, Sid gave an apple to",
    "When Dan and Sid went to the shops, Dan gave an apple to",
    "After Martin and Amy went to the park, Amy gave a drink to",
    "After Martin and Amy went to the park, Martin gave a drink to",
]
answers = [
    (" Mary", " John"),
    (" John", " Mary"),
    (" Tom", " James"),
    (" James", " Tom"),
    (" Dan", " Sid"),
    (" Sid", " Dan"),
    (" Martin", " Amy"),
    (" Amy", " Martin"),
]
clean_tokens = model.to_tokens(prompts)
corrupted_tokens = clean_tokens[
    [(i + 1 if i % 2 == 0 else i - 1) for i in range(len(clean_tokens))]
]
print("Clean string 0", model.to_string(clean_tokens[0]))
print("Corrupted string 0", model.to_string(corrupted_tokens[0]))
answer_token_indices = torch.tensor(
    [[model.to_single_token(answers[i][j]) for j in range(2)] for i in range(len(answers))],
    device=model.cfg.device,
)
print("Answer token indices", answer_token_indices)


def get_logit_diff(logits, answer_token_indices=answer_token_indices):
    if len(logits.shape) == 3:
        logits = logits[:, -1, :]  # the final position's logits only
    correct_logits = logits.gather(1, answer_token_indices[:, 0].unsqueeze(1))
    incorrect_logits = logits.gather(1, answer_token_indices[:, 1].unsqueeze(1))
    return (correct_logits - incorrect_logits).mean()


clean_logits, clean_cache = model.run_with_cache(clean_tokens)
corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens)
clean_logit_diff = get_logit_diff(clean_logits, answer_token_indices).item()
print(f"Clean logit diff: {clean_logit_diff:.4f}")
corrupted_logit_diff = get_logit_diff(corrupted_logits, answer_token_indices).item()
print(f"Corrupted logit diff: {corrupted_logit_diff:.4f}")

CLEAN_BASELINE = clean_logit_diff
CORRUPTED_BASELINE = corrupted_logit_diff


def ioi_metric(logits, answer_token_indices=answer_token_indices):
    return (get_logit_diff(logits, answer_token_indices) - CORRUPTED_BASELINE) / (
        CLEAN_BASELINE - CORRUPTED_BASELINE
    )


print(f"Clean Baseline is 1: {ioi_metric(clean_logits).item():.4f}")
print(f"Corrupted Baseline is 0: {ioi_metric(corrupted_logits).item():.4f}")

# --- The patching functions: residual stream, heads (all positions, by position), blocks
resid_pre_act_patch_results = patching.get_act_patch_resid_pre(
    model, corrupted_tokens, clean_cache, ioi_metric
)
imshow(resid_pre_act_patch_results, yaxis="Layer", title="resid_pre Activation Patching")
attn_head_out_all_pos_act_patch_results = patching.get_act_patch_attn_head_out_all_pos(
    model, corrupted_tokens, clean_cache, ioi_metric
)
imshow(attn_head_out_all_pos_act_patch_results, title="attn_head_out Activation Patching (All Pos)")
ALL_HEAD_LABELS = [f"L{i}H{j}" for i in range(model.cfg.n_layers) for j in range(model.cfg.n_heads)]
attn_head_out_act_patch_results = einops.rearrange(
    patching.get_act_patch_attn_head_out_by_pos(model, corrupted_tokens, clean_cache, ioi_metric),
    "layer pos head -> (layer head) pos",
)
imshow(
    attn_head_out_act_patch_results,
    y=ALL_HEAD_LABELS,
    title="attn_head_out Activation Patching By Pos",
)
every_block_result = patching.get_act_patch_block_every(
    model, corrupted_tokens, clean_cache, ioi_metric
)
imshow(every_block_result, facet_col=0, title="Activation Patching Per Block")
every_head_all_pos_act_patch_result = patching.get_act_patch_attn_head_all_pos_every(
    model, corrupted_tokens, clean_cache, ioi_metric
)
imshow(
    every_head_all_pos_act_patch_result, facet_col=0, title="Activation Patching Per Head (All Pos)"
)
every_head_act_patch_result = einops.rearrange(
    patching.get_act_patch_attn_head_by_pos_every(model, corrupted_tokens, clean_cache, ioi_metric),
    "act_type layer pos head -> act_type (layer head) pos",
)
imshow(every_head_act_patch_result, facet_col=0, title="Activation Patching Per Head (By Pos)")

# --- Induction on an attention-only model: repeated random tokens, the second half patched
attn_only = HookedTransformer(HookedTransformerConfig(**attn_only_config), tokenizer)
attn_only.load_state_dict(attn_only_weights, strict=False)
attn_only.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
batch = 4
seq_len = 8
generator = torch.Generator().manual_seed(0)
d_vocab = attn_only.cfg.d_vocab
rand_tokens_A = torch.randint(1, d_vocab, (batch, seq_len), generator=generator)
rand_tokens_B = torch.randint(1, d_vocab, (batch, seq_len), generator=generator)
rand_tokens_C = torch.randint(1, d_vocab, (batch, seq_len), generator=generator)
bos = torch.tensor([attn_only.tokenizer.bos_token_id] * batch)[:, None]
clean_tokens_induction = torch.cat([bos, rand_tokens_A, rand_tokens_A], dim=1)
corrupted_tokens_induction = torch.cat([bos, rand_tokens_A, rand_tokens_B], dim=1)
clean_logits_induction, clean_cache_induction = attn_only.run_with_cache(clean_tokens_induction)
corrupted_logits_induction, corrupted_cache_induction = attn_only.run_with_cache(
    corrupted_tokens_induction
)


def induction_loss(logits, answer_token_indices=rand_tokens_A):
    seq_len = answer_token_indices.shape[1]
    # The second half's predictions but its last (the first answer cannot be predicted).
    final_log_probs = logits[:, -seq_len:-1].log_softmax(-1)
    return final_log_probs.gather(-1, answer_token_indices[:, 1:].unsqueeze(-1)).mean()


CLEAN_BASELINE_INDUCTION = induction_loss(clean_logits_induction).item()
print("Clean baseline:", CLEAN_BASELINE_INDUCTION)
CORRUPTED_BASELINE_INDUCTION = induction_loss(corrupted_logits_induction).item()
print("Corrupted baseline:", CORRUPTED_BASELINE_INDUCTION)

every_head_all_pos_act_patch_result = patching.get_act_patch_attn_head_all_pos_every(
    attn_only, corrupted_tokens_induction, clean_cache_induction, induction_loss
)
imshow(every_head_all_pos_act_patch_result, facet_col=0, title="Induction Per Head (All Pos)")
every_head_act_patch_result = einops.rearrange(
    patching.get_act_patch_attn_head_by_pos_every(
        attn_only, corrupted_tokens_induction, clean_cache_induction, induction_loss
    ),
    "act_type layer pos head -> act_type (layer head) pos",
)
imshow(every_head_act_patch_result, facet_col=0, title="Induction Per Head (By Pos)")

# Which half's tokens the heads' queries, keys and values read, by corrupting each half.
for name, first, second in [
    ("BA", rand_tokens_B, rand_tokens_A),
    ("BB", rand_tokens_B, rand_tokens_B),
    ("BC", rand_tokens_B, rand_tokens_C),
]:
    corrupted = torch.cat([bos, first, second], dim=1)
    imshow(
        patching.get_act_patch_attn_head_all_pos_every(
            attn_only, corrupted, clean_cache_induction, induction_loss
        ),
        facet_col=0,
        title=f"Activation Patching Per Head on {name} (All Pos)",
    )
results["version_module"] = transformer_lens.__name__
