# ruff: noqa: E501, N816  (the demo's lines and names, kept as TL 4 wrote them)
"""TransformerLens 4's Main Demo (demos/Main_Demo.ipynb) on TransformerBridge, after the alias line.

Its code cells as TL 4 wrote them, with the plots printed instead of drawn and these
changes for a small model: `model_path` (default GPT-2 small from the hub; the test passes
a tiny local GPT-2) and sizes fitted to it (head 3 rather than 8, 20 repeated tokens
rather than 50, ids drawn below `d_vocab`, words of its vocabulary). Left out: the
circuitsvis and plotly cells, distilgpt2, checkpoint listing and evals (hub models), and
the cell that prints each hook's name (TL 4 names hook points after its components, we
after TL 3's; TL 4's names are aliases here, docs/guide/porting.md).

Run it as `python scripts/tl4_main_demo.py`; tests/tl/test_tl_bridge_demo.py runs the same
text under real TransformerLens 4.3 (without the alias line) and under hookedattn_tl, on
the same weights, and compares every printed number.
"""

import hookedattn_tl.as_transformer_lens  # noqa: F401  (the alias line)

# isort: split
from functools import partial

import einops
import torch
import torch.nn as nn
import transformer_lens.utilities as utils
from jaxtyping import Float
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint
from transformer_lens.model_bridge import TransformerBridge

results = {}
torch.set_grad_enabled(False)
model_path = globals().get("model_path", "openai-community/gpt2")
device = "cpu"

# --- Loading and running models
model = TransformerBridge.boot_transformers(model_path, device=device)
model.enable_compatibility_mode(disable_warnings=True)

model_description_text = "After Martin and Amy went to the park, Amy gave a drink to Martin"
loss = model(model_description_text, return_type="loss")
print("Model loss:", loss)

# --- Caching all activations
gpt2_text = "When John and Mary went to the shops, John gave the bag to Mary"
gpt2_tokens = model.to_tokens(gpt2_text)
print(gpt2_tokens.device)
gpt2_logits, gpt2_cache = model.run_with_cache(gpt2_tokens, remove_batch_dim=True)
print(type(gpt2_cache).__name__)
attention_pattern = gpt2_cache["pattern", 0, "attn"]
print(attention_pattern.shape)
gpt2_str_tokens = model.to_str_tokens(gpt2_text)
print(gpt2_str_tokens)

attn_hook_name = "blocks.0.attn.hook_pattern"
attn_layer = 0
_, gpt2_attn_cache = model.run_with_cache(
    gpt2_tokens, remove_batch_dim=True, stop_at_layer=attn_layer + 1, names_filter=[attn_hook_name]
)
gpt2_attn = gpt2_attn_cache[attn_hook_name]
assert torch.allclose(gpt2_attn, attention_pattern)
results["pattern"] = attention_pattern

# --- Hooks: ablating a head
layer_to_ablate = 0
head_index_to_ablate = 3


def head_ablation_hook(
    value: Float[torch.Tensor, "batch pos head_index d_head"], hook: HookPoint
) -> Float[torch.Tensor, "batch pos head_index d_head"]:
    print(f"Shape of the value tensor: {value.shape}")
    value[:, :, head_index_to_ablate, :] = 0.0
    return value


original_loss = model(gpt2_tokens, return_type="loss")
ablated_loss = model.run_with_hooks(
    gpt2_tokens,
    return_type="loss",
    fwd_hooks=[(utils.get_act_name("v", layer_to_ablate), head_ablation_hook)],
)
print(f"Original Loss: {original_loss.item():.3f}")
print(f"Ablated Loss: {ablated_loss.item():.3f}")

# --- Activation patching on the indirect object task
clean_prompt = "After John and Mary went to the store, Mary gave a bottle of milk to"
corrupted_prompt = "After John and Mary went to the store, John gave a bottle of milk to"

clean_tokens = model.to_tokens(clean_prompt)
corrupted_tokens = model.to_tokens(corrupted_prompt)


def logits_to_logit_diff(logits, correct_answer=" John", incorrect_answer=" Mary"):
    correct_index = model.to_single_token(correct_answer)
    incorrect_index = model.to_single_token(incorrect_answer)
    return logits[0, -1, correct_index] - logits[0, -1, incorrect_index]


clean_logits, clean_cache = model.run_with_cache(clean_tokens)
clean_logit_diff = logits_to_logit_diff(clean_logits)
print(f"Clean logit difference: {clean_logit_diff.item():.3f}")

corrupted_logits = model(corrupted_tokens)
corrupted_logit_diff = logits_to_logit_diff(corrupted_logits)
print(f"Corrupted logit difference: {corrupted_logit_diff.item():.3f}")


def residual_stream_patching_hook(
    resid_pre: Float[torch.Tensor, "batch pos d_model"], hook: HookPoint, position: int
) -> Float[torch.Tensor, "batch pos d_model"]:
    clean_resid_pre = clean_cache[hook.name]
    resid_pre[:, position, :] = clean_resid_pre[:, position, :]
    return resid_pre


num_positions = len(clean_tokens[0])
ioi_patching_result = torch.zeros((model.cfg.n_layers, num_positions), device=model.cfg.device)

for layer in range(model.cfg.n_layers):
    for position in range(num_positions):
        temp_hook_fn = partial(residual_stream_patching_hook, position=position)
        # TL 4's short name "in": the block's input, blocks.{layer}.hook_in
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("in", layer), temp_hook_fn)]
        )
        patched_logit_diff = logits_to_logit_diff(patched_logits).detach()
        ioi_patching_result[layer, position] = (patched_logit_diff - corrupted_logit_diff) / (
            clean_logit_diff - corrupted_logit_diff
        )
print("Normalized logit difference after patching the residual stream:")
print(ioi_patching_result)
results["ioi_patching_result"] = ioi_patching_result

# --- Induction heads on repeated random tokens
batch_size = 10
seq_len = 20
size = (batch_size, seq_len)
torch.manual_seed(50)
input_tensor = torch.randint(1, model.cfg.d_vocab, size)

random_tokens = input_tensor.to(model.cfg.device)
repeated_tokens = einops.repeat(random_tokens, "batch seq_len -> batch (2 seq_len)")
repeated_logits = model(repeated_tokens)
correct_log_probs = model.loss_fn(repeated_logits, repeated_tokens, per_token=True)
loss_by_position = einops.reduce(correct_log_probs, "batch position -> position", "mean")
print("Loss by position on random repeated tokens:")
print(loss_by_position)

induction_score_store = torch.zeros(
    (model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device
)


def induction_score_hook(
    pattern: Float[torch.Tensor, "batch head_index dest_pos source_pos"],
    hook: HookPoint,
):
    induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    induction_score = einops.reduce(
        induction_stripe, "batch head_index position -> head_index", "mean"
    )
    induction_score_store[hook.layer(), :] = induction_score


pattern_hook_names_filter = lambda name: name.endswith("pattern")

model.run_with_hooks(
    repeated_tokens,
    return_type=None,
    fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)],
)
print("Induction score by head:")
print(induction_score_store)
results["induction_scores"] = induction_score_store

# --- Available models: the unembedding bias
unembed_bias = model.unembed.b_U
bias_values, bias_indices = unembed_bias.sort(descending=True)
top_k = 5
print(f"Top {top_k} values")
for i in range(top_k):
    print(f"{bias_values[i].item():.2f} {model.to_string(bias_indices[i])!r}")
print("...")
print(f"Bottom {top_k} values")
for i in range(top_k, 0, -1):
    print(f"{bias_values[-i].item():.2f} {model.to_string(bias_indices[-i])!r}")

john_bias = model.unembed.b_U[model.to_single_token(" John")]
mary_bias = model.unembed.b_U[model.to_single_token(" Mary")]
print(f"John bias: {john_bias.item():.4f}")
print(f"Mary bias: {mary_bias.item():.4f}")
print(f"Prob ratio bias: {torch.exp(john_bias - mary_bias).item():.4f}x")

# --- Tokenization
example_text = "The first thing you need to figure out is *how* things are tokenized."
example_text_str_tokens = model.to_str_tokens(example_text)
print(example_text_str_tokens)
example_text_tokens = model.to_tokens(example_text)
print(example_text_tokens)
example_multi_text = ["The cat sat on the mat.", "The cat sat on the mat really hard."]
example_multi_text_tokens = model.to_tokens(example_multi_text)
print(example_multi_text_tokens)

cat_text = "The cat went to the shops."
cat_logits = model(cat_text)
cat_probs = cat_logits.softmax(dim=-1)
print(f"Probability tensor shape [batch, position, d_vocab] == {cat_probs.shape}")
the_token_index = model.to_single_token(" the")
print(f"| the| probability: {cat_probs[0, -1, the_token_index].item():.2%}")

print(f"Token 256 - the most common pair of ASCII characters: |{model.to_string(256)}|")
print(f"De-Tokenizing the example tokens: {model.to_string(example_text_tokens.squeeze())}")

print("With BOS:", model.get_token_position(" Mary", "When John and Mary went to the shops"))
print(
    "Without BOS:",
    model.get_token_position(" Mary", "When John and Mary went to the shops", prepend_bos=False),
)
print(
    "First occurrence",
    model.get_token_position(" the", "John went to the shops, Mary to the park.", mode="first"),
)
print(
    "Final occurrence",
    model.get_token_position(" the", "John went to the shops, Mary to the park.", mode="last"),
)
print(model.to_str_tokens("2342+2017=21445"))

print("Logits shape by default (with BOS)", model("Hello World").shape)
print("Logits shape with BOS", model("Hello World", prepend_bos=True).shape)
print("Logits shape without BOS - only 2 positions!", model("Hello World", prepend_bos=False).shape)

ioi_text = "When John and Mary went to the shops, Mary gave the bag to"
ioi_logits_with_bos = model(ioi_text, prepend_bos=True)
mary_logit_with_bos = ioi_logits_with_bos[0, -1, model.to_single_token(" Mary")].item()
john_logit_with_bos = ioi_logits_with_bos[0, -1, model.to_single_token(" John")].item()
print(f"Logit difference with BOS: {(john_logit_with_bos - mary_logit_with_bos):.3f}")
ioi_logits_without_bos = model(ioi_text, prepend_bos=False)
mary_logit_without_bos = ioi_logits_without_bos[0, -1, model.to_single_token(" Mary")].item()
john_logit_without_bos = ioi_logits_without_bos[0, -1, model.to_single_token(" John")].item()
print(f"Logit difference without BOS: {(john_logit_without_bos - mary_logit_without_bos):.3f}")
print(f"| John| -> {model.to_str_tokens(' John', prepend_bos=False)}")
print(f"|John| -> {model.to_str_tokens('John', prepend_bos=False)}")

# --- Factored matrices
torch.manual_seed(50)
A = torch.randn(5, 2)
B = torch.randn(2, 5)
AB = A @ B
AB_factor = FactoredMatrix(A, B)
print("Norms:")
print(AB.norm())
print(AB_factor.norm())
print(
    f"Right dimension: {AB_factor.rdim}, Left dimension: {AB_factor.ldim}, Hidden dimension: {AB_factor.mdim}"
)
print("Singular Values:")
print(torch.linalg.svd(AB).S)
print(AB_factor.S)

C = torch.randn(5, 300)
ABC = AB @ C
ABC_factor = AB_factor @ C
print("Unfactored:", ABC.shape, ABC.norm().round(decimals=3))
print("Factored:", ABC_factor.shape, ABC_factor.norm().round(decimals=3))
print(
    f"Right dimension: {ABC_factor.rdim}, Left dimension: {ABC_factor.ldim}, Hidden dimension: {ABC_factor.mdim}"
)
AB_unfactored = AB_factor.AB
print(torch.isclose(AB_unfactored, AB).all())

# --- The OV circuit of every head
OV_circuit_all_heads = model.OV
print(OV_circuit_all_heads)
OV_circuit_all_heads_eigenvalues = OV_circuit_all_heads.eigenvalues
print(OV_circuit_all_heads_eigenvalues.shape)
print(OV_circuit_all_heads_eigenvalues.dtype)
OV_copying_score = OV_circuit_all_heads_eigenvalues.sum(
    dim=-1
).real / OV_circuit_all_heads_eigenvalues.abs().sum(dim=-1)
print("OV copying score for each head:")
print(OV_copying_score)
results["OV_copying_score"] = OV_copying_score

full_OV_circuit = model.embed.W_E @ OV_circuit_all_heads @ model.unembed.W_U
print(full_OV_circuit)
full_OV_circuit_eigenvalues = full_OV_circuit.eigenvalues
print(full_OV_circuit_eigenvalues.shape)
print(full_OV_circuit_eigenvalues.dtype)
full_OV_copying_score = full_OV_circuit_eigenvalues.sum(
    dim=-1
).real / full_OV_circuit_eigenvalues.abs().sum(dim=-1)
print("Full OV copying score for each head:")
print(full_OV_copying_score)

# --- Hook points on a model of your own
from transformer_lens.HookedRootModule import HookedRootModule  # noqa: E402


class SquareThenAdd(nn.Module):
    def __init__(self, offset):
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(offset))
        self.hook_square = HookPoint()

    def forward(self, x):
        square = self.hook_square(x * x)
        return self.offset + square


class TwoLayerModel(HookedRootModule):
    def __init__(self):
        super().__init__()
        self.layer1 = SquareThenAdd(3.0)
        self.layer2 = SquareThenAdd(-4.0)
        self.hook_in = HookPoint()
        self.hook_mid = HookPoint()
        self.hook_out = HookPoint()
        super().setup()

    def forward(self, x):
        x_in = self.hook_in(x)
        x_mid = self.hook_mid(self.layer1(x_in))
        x_out = self.hook_out(self.layer2(x_mid))
        return x_out


toy = TwoLayerModel()
out, cache = toy.run_with_cache(torch.tensor(5.0))
print("Model output:", out.item())
for key in cache:
    print(f"Value cached at hook {key}", cache[key].item())


def set_to_zero_hook(tensor, hook):
    print(hook.name)
    return torch.tensor(0.0)


print(
    "Output after intervening on layer2.hook_square",
    toy.run_with_hooks(
        torch.tensor(5.0), fwd_hooks=[("layer2.hook_square", set_to_zero_hook)]
    ).item(),
)

# --- TL-style parameter names (the norms' folded weights left out: TL 4 keeps them as
# ones and zeros, we drop them)
for name, param in sorted(model.tl_named_parameters()):
    if ".ln" not in name and not name.startswith("ln_final"):
        print(name, tuple(param.shape))
