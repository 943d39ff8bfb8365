# ruff: noqa: E402, E501  (the tutorial's imports where it makes them, and its lines)
"""SAELens's tutorial "Loading and Analysing Pre-Trained Sparse Autoencoders"
(tutorials/basic_loading_and_analysing.ipynb, unchanged since SAELens 6.0), ported.

Its code cells as SAELens wrote them, after the alias line, with the plots printed instead
of drawn (the L0 histogram as counts). Each line that changes in the port follows a comment
`# SAELens: <the original line>`:
- the SAE class: `hookedattn.sae.SparseAutoencoder`, loaded by the same release name;
- the SAE's hook name, which ours keeps as `cfg.hook_name` (SAELens: `cfg.metadata`);
- the context size and BOS setting, which the tutorial reads from `sae.cfg.metadata`: ours
  keeps no training metadata, so they are written out (the values in the release's cfg.json);
- the last cell's hook, which returns the prompt's reconstruction while `test_prompt` runs
  the prompt and the answer, one position more. TransformerLens runs the rest of the model
  on the shorter stream; our hook points refuse a changed shape, so the port writes the
  reconstruction over the prompt's positions and keeps the answer's: the same logits where
  `test_prompt` reads them (attention is causal).

The dataset cell reads the texts from `texts` when the caller gives them (the test passes
local text; NeelNanda/pile-10k otherwise) and cuts them into rows of the SAE's context with a
few lines of its own in place of `transformer_lens.utils.tokenize_and_concatenate` (which
needs `datasets`, not a dependency here): the texts joined by EOS, tokenized, a BOS first.
Left out: the Colab set-up, the HTML viewer helper, the feature dashboards (sae-dashboard)
and the Neuronpedia quick list (a web service). The last section is the analysis of SAELens's
Hooked SAE Transformer demo on the same SAE: the features that fire on the prompt, the
feature density on the batch, the logit-lens view of the top feature (`W_dec @ W_U`) and its
ablation through the SAE with the error term.

Run it as `python scripts/saelens_tutorial.py` (GPT-2 small and `gpt2-small-res-jb` from the
hub); tests/tl/test_saelens_tutorial.py runs the same text under real SAELens 6.54.12 (the
port lines put back, the alias line removed) and under hookedattn_tl, both loading by name
from a local hub that serves tiny stand-ins, and compares every printed number.
"""

import hookedattn_tl.as_transformer_lens  # noqa: F401  (the alias line)

# isort: split
import os  # noqa: F401  (the tutorial's imports, for its viewer helper)

import torch

results = {}
torch.set_grad_enabled(False)

# --- Set up
if torch.backends.mps.is_available():
    device = "mps"
else:
    device = "cuda" if torch.cuda.is_available() else "cpu"

print(f"Device: {device}")

# --- Loading a pretrained Sparse Autoencoder
from transformer_lens import HookedTransformer

# SAELens: from sae_lens import SAE
from hookedattn.sae import SparseAutoencoder as SAE  # noqa: N814  (the tutorial's name)

model = HookedTransformer.from_pretrained("gpt2-small", device=device)

sae = SAE.from_pretrained(
    release="gpt2-small-res-jb",  # see other options in sae_lens/pretrained_saes.yaml
    sae_id="blocks.8.hook_resid_pre",  # won't always be a hook point
    device=device,
)
# SAELens: hook_name = sae.cfg.metadata.hook_name
hook_name = sae.cfg.hook_name
# SAELens: context_size, prepend_bos = sae.cfg.metadata.context_size, sae.cfg.metadata.prepend_bos
context_size, prepend_bos = 24, True
print("SAE:", hook_name, tuple(sae.W_enc.shape), context_size, prepend_bos)

texts = globals().get("texts")
if texts is None:
    from datasets import load_dataset

    texts = load_dataset(path="NeelNanda/pile-10k", split="train", streaming=False)["text"]


def tokenize_and_concatenate(texts, tokenizer, max_length, add_bos_token):
    """Rows of `max_length` tokens: the texts joined by EOS, tokenized, BOS first."""
    ids = tokenizer(tokenizer.eos_token.join(texts), add_special_tokens=False)["input_ids"]
    width = max_length - 1 if add_bos_token else max_length
    rows = torch.tensor(ids[: len(ids) // width * width]).reshape(-1, width)
    if add_bos_token:
        rows = torch.cat([torch.full((len(rows), 1), tokenizer.bos_token_id), rows], dim=1)
    return {"tokens": rows}


token_dataset = tokenize_and_concatenate(
    texts, model.tokenizer, max_length=context_size, add_bos_token=prepend_bos
)

# --- Basic analysis: L0 test and reconstruction test
sae.eval()  # prevents error if we're expecting a dead neuron mask for who grads

with torch.no_grad():
    # activation store can give us tokens.
    batch_tokens = token_dataset["tokens"][:32]
    _, cache = model.run_with_cache(batch_tokens, prepend_bos=True)

    # Use the SAE
    feature_acts = sae.encode(cache[hook_name])
    sae_out = sae.decode(feature_acts)

    # save some room
    del cache

    # ignore the bos token, get the number of features that activated in each token, averaged accross batch and position
    l0 = (feature_acts[:, 1:] > 0).float().sum(-1).detach()
    print("average l0", l0.mean().item())
    print("l0 histogram", torch.bincount(l0.flatten().long()).tolist())
results["feature_acts"] = feature_acts
results["sae_out"] = sae_out

from functools import partial

from transformer_lens import utils


# next we want to do a reconstruction test.
def reconstr_hook(activation, hook, sae_out):
    return sae_out


def zero_abl_hook(activation, hook):
    return torch.zeros_like(activation)


print("Orig", model(batch_tokens, return_type="loss").item())
print(
    "reconstr",
    model.run_with_hooks(
        batch_tokens,
        fwd_hooks=[
            (
                hook_name,
                partial(reconstr_hook, sae_out=sae_out),
            )
        ],
        return_type="loss",
    ).item(),
)
print(
    "Zero",
    model.run_with_hooks(
        batch_tokens,
        return_type="loss",
        fwd_hooks=[(hook_name, zero_abl_hook)],
    ).item(),
)

# --- Specific capability test
example_prompt = "When John and Mary went to the shops, John gave the bag to"
example_answer = " Mary"
utils.test_prompt(example_prompt, example_answer, model, prepend_bos=True)

logits, cache = model.run_with_cache(example_prompt, prepend_bos=True)
tokens = model.to_tokens(example_prompt)
sae_out = sae(cache[hook_name])


def reconstr_hook(activations, hook, sae_out):
    # SAELens: return sae_out
    return torch.cat([sae_out, activations[:, sae_out.shape[1] :]], dim=1)


def zero_abl_hook(mlp_out, hook):
    return torch.zeros_like(mlp_out)


print("Orig", model(tokens, return_type="loss").item())
print(
    "reconstr",
    model.run_with_hooks(
        tokens,
        fwd_hooks=[
            (
                hook_name,
                partial(reconstr_hook, sae_out=sae_out),
            )
        ],
        return_type="loss",
    ).item(),
)
print(
    "Zero",
    model.run_with_hooks(
        tokens,
        return_type="loss",
        fwd_hooks=[(hook_name, zero_abl_hook)],
    ).item(),
)


with model.hooks(
    fwd_hooks=[
        (
            hook_name,
            partial(reconstr_hook, sae_out=sae_out),
        )
    ]
):
    utils.test_prompt(example_prompt, example_answer, model, prepend_bos=True)

# --- Analysing features on the HookedSAETransformer (the Hooked SAE Transformer demo's way)
# SAELens: from sae_lens import HookedSAETransformer
from transformer_lens import HookedSAETransformer

sae_model = HookedSAETransformer.from_pretrained("gpt2-small", device=device)
_, cache = sae_model.run_with_cache_with_saes(example_prompt, saes=[sae])
last_acts = cache[f"{hook_name}.hook_sae_acts_post"][0, -1]
print("features active at the last token:", (last_acts > 0).sum().item())
top_values, top_features = last_acts.topk(5)
for value, feature in zip(top_values, top_features, strict=True):
    print(f"feature {feature.item()}: {value.item():.4f}")
results["last_acts"] = last_acts

feature_density = (feature_acts[:, 1:] > 0).float().mean((0, 1))
print("dead features on the batch:", (feature_density == 0).sum().item())
densest = feature_density.sort(descending=True, stable=True)  # ties in feature order
for density, feature in zip(densest.values[:5], densest.indices[:5], strict=True):
    print(f"feature {feature.item()} density {density.item():.4f}")
results["feature_density"] = feature_density

# The logit lens: what the top feature's decoder direction writes to the unembedding.
feature = top_features[0].item()
feature_logits = sae.W_dec[feature] @ sae_model.W_U
top_logits = feature_logits.topk(5)
bottom_logits = feature_logits.topk(5, largest=False)
for name, found in (("promoted", top_logits), ("suppressed", bottom_logits)):
    for logit, token in zip(found.values, found.indices, strict=True):
        print(f"{name}: {sae_model.to_string(token)!r} {logit.item():.4f}")
results["feature_logits"] = feature_logits


# Ablating the feature: with the error term the SAE leaves the model's output as it was,
# so what changes is that feature's write alone.
def ablate_feature_hook(acts, hook, feature):
    acts[:, :, feature] = 0.0
    return acts


answer_token = sae_model.to_single_token(example_answer)
clean_logits = sae_model(example_prompt)
sae_model.add_sae(sae, use_error_term=True)
kept_logits = sae_model(example_prompt)
ablated_logits = sae_model.run_with_hooks(
    example_prompt,
    fwd_hooks=[(f"{hook_name}.hook_sae_acts_post", partial(ablate_feature_hook, feature=feature))],
)
sae_model.reset_saes()
print(
    "with the SAE and its error term, the logits as they were:",
    torch.allclose(kept_logits, clean_logits, atol=1e-4),
)
print(
    f"answer logit: clean {clean_logits[0, -1, answer_token].item():.4f}, ablated {ablated_logits[0, -1, answer_token].item():.4f}"
)
print(
    f"loss: clean {sae_model(example_prompt, return_type='loss').item():.4f}, ablated {sae_model.loss_fn(ablated_logits, tokens).item():.4f}"
)
results["ablated_logits"] = ablated_logits
