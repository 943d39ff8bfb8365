"""An HF model and our import of it, side by side, and the checks the family tests
(tests/hf/test_hf_families.py, test_hf_moe.py, test_hf_deepseek.py) run on every case:
logits against three references, the residual stream entering each block, attention
patterns, greedy generation (plain and left-padded), a left-padded batch, a saved directory.

Each test file builds its own HF models (`make_hf(case, dtype)`) from its own cases; `Pair`
imports one, and in float64 also wraps a second copy as `exact`, HF's own model computing in
float64 throughout (`InFloat64Throughout`), the reference the 1e-10 checks are made against.
"""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from helpers.float64_hf import InFloat64Throughout
from hookedattn import HookedTransformer
from hookedattn.testing import Constants, published_constants

PAD = 0
TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 11, 38, 7], [9, 63, 12, 12, 33, 7, 2, 50, 9, 4, 4, 21]]
)
# Our logits against HF's: (our dtype, the HF forward, the largest difference). Stock HF in
# float64 rounds some steps to float32, so only HF's float64 math (`exact`) agrees to 1e-10.
LOGIT_REFERENCES = {
    "hf_float32": (torch.float32, "hf", 1e-5),
    "hf_float64": (torch.float64, "exact", 1e-10),
    "stock_hf_float64_to_its_float32_roundings": (torch.float64, "hf", 1e-5),
}


class Pair:
    """An HF model and our import of it, in one dtype; in float64 also `exact`, HF's model
    computing in float64 throughout."""

    def __init__(self, make_hf: Callable, case: str, dtype: torch.dtype) -> None:
        self.hf = make_hf(case, dtype)
        self.ours = HookedTransformer.from_hf(self.hf)
        if dtype == torch.float64:
            self.exact = InFloat64Throughout(make_hf(case, dtype))


def pair_fixtures(cases: dict, make_hf: Callable):
    """The module-scoped fixtures `case` (each key of `cases`), `pair32` and `pair64` (a
    `Pair` of that case in float32 and float64), for a test module to bind by those names."""

    @pytest.fixture(scope="module", params=list(cases))
    def case(request):
        return request.param

    @pytest.fixture(scope="module")
    def pair32(case):
        return Pair(make_hf, case, torch.float32)

    @pytest.fixture(scope="module")
    def pair64(case):
        return Pair(make_hf, case, torch.float64)

    return case, pair32, pair64


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest `|a - b|`."""
    return float((a.detach() - b.detach()).abs().max())


def hf_constants(config) -> Constants:
    """The constants the checkpoint's own config states, under HF's names: the norms'
    epsilon (1e-5 where it states none) and what the scores are divided by (Gemma 2 and 3:
    `sqrt(query_pre_attn_scalar)`)."""
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    eps_names = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
    eps = next((getattr(config, name) for name in eps_names if hasattr(config, name)), 1e-5)
    attn_scale = getattr(config, "query_pre_attn_scalar", d_head) ** 0.5
    return published_constants(d_head, eps=eps, attn_scale=attn_scale)


def assert_logits_equal(reference: str, pair32: Pair, pair64: Pair) -> None:
    """Our logits on `TOKENS` within `LOGIT_REFERENCES[reference]`'s bound of its forward's."""
    dtype, forward, largest = LOGIT_REFERENCES[reference]
    pair = pair32 if dtype == torch.float32 else pair64
    with torch.no_grad():
        expected = getattr(pair, forward)(TOKENS).logits
    assert max_abs(pair.ours(TOKENS), expected) <= largest


def assert_resid_pre_equals_hidden_states(pair64: Pair) -> None:
    """HF's hidden_states (the input of each block, then the final one after the last norm)
    equal our `resid_pre` of each layer and `ln_final.hook_out`, to 1e-10."""
    with torch.no_grad():
        hidden = pair64.exact(TOKENS, output_hidden_states=True).hidden_states
    _, cache = pair64.ours.run_with_cache(TOKENS)
    for layer in range(pair64.ours.cfg.n_layers):
        assert max_abs(cache["resid_pre", layer], hidden[layer]) <= 1e-10, layer
    assert max_abs(cache["ln_final.hook_out"], hidden[-1]) <= 1e-10


def assert_patterns_equal_hf_attentions(pair64: Pair) -> None:
    """Our attention pattern of each layer equals HF's eager `attentions`, to 1e-10."""
    with torch.no_grad():
        attentions = pair64.exact(TOKENS, output_attentions=True).attentions
    _, cache = pair64.ours.run_with_cache(TOKENS)
    for layer, expected in enumerate(attentions):
        assert max_abs(cache["pattern", layer], expected) <= 1e-10, layer


def assert_greedy_generation_equal(pair32: Pair) -> None:
    """Eight greedy tokens after `TOKENS[:, :5]` equal HF's `generate`."""
    prompt = TOKENS[:, :5]
    expected = pair32.hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    ours = pair32.ours.generate(prompt, max_new_tokens=8, do_sample=False, stop_at_eos=False)
    assert torch.equal(ours, expected)


def assert_left_padded_batch_equals_each_prompt(pair64: Pair) -> None:
    """A batch of prompts 9 and 12 tokens long, the first left-padded by 3 (past 4-token
    windows), gives each prompt's logits alone, to 1e-10."""
    lengths = (9, 12)
    tokens = torch.full((2, 12), PAD)
    mask = torch.zeros(2, 12, dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, 12 - length :] = TOKENS[row, :length]
        mask[row, 12 - length :] = 1
    logits = pair64.ours(tokens, attention_mask=mask)
    for row, length in enumerate(lengths):
        alone = pair64.ours(TOKENS[row : row + 1, :length])[0]
        assert max_abs(logits[row, 12 - length :], alone) <= 1e-10, row


def assert_left_padded_generation_equal(pair32: Pair) -> None:
    """Greedy generation from a left-padded batch equals HF's `generate` with the same mask.
    Stock HF in float32: in float64 its fully masked padding rows become NaN (a float64 mask
    minimum cast to float32 is -inf before its softmax), and the NaN reaches real tokens."""
    tokens = torch.tensor([[PAD, PAD, PAD, 5, 17, 3], [8, 60, 1, 29, 4, 30]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    expected = pair32.hf.generate(
        tokens, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD
    )
    ours = pair32.ours.generate(
        tokens, max_new_tokens=8, do_sample=False, stop_at_eos=False, attention_mask=mask
    )
    assert torch.equal(ours, expected)


def assert_loads_like_the_live_model(loaded: HookedTransformer, pair32: Pair) -> None:
    """`loaded` (from `pair32.hf`'s saved directory) has the live import's config (but its
    name) and the same tensors under the same names, each equal."""
    assert loaded.cfg == pair32.ours.cfg.replace(model_name=loaded.cfg.model_name)
    ours = pair32.ours.state_dict()
    assert loaded.state_dict().keys() == ours.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ours[name]), name


def assert_saved_directory_loads_like_the_live_model(pair32: Pair, folder: Path) -> None:
    """`pair32.hf` saved to `folder` and imported from there loads like the live import."""
    pair32.hf.save_pretrained(folder)
    assert_loads_like_the_live_model(HookedTransformer.from_hf(folder), pair32)


def assert_shares_no_memory_with_hf(pair32: Pair) -> None:
    """No tensor of our import lies in the storage of one of HF's."""
    hf_pointers = {t.untyped_storage().data_ptr() for t in pair32.hf.state_dict().values()}
    for name, tensor in pair32.ours.state_dict().items():
        assert tensor.untyped_storage().data_ptr() not in hf_pointers, name
