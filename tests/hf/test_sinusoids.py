"""Fixed sinusoidal positions (`hf/_sinusoids.py`): the two tables against their formulas
written out one value at a time with Python's `math`, and XGLM (tensor2tensor's table
from row 2, a `sqrt(d_model)` embedding) imported by convention against `transformers` in
float64, live and from its folder (where no file holds the table)."""

import math

import pytest
import torch

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _sinusoids, _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12]])


def test_the_halves_table_is_sines_then_cosines_of_geometric_frequencies():
    rows, width = 30, 10
    half = width // 2
    expected = [[math.sin(p * math.exp(-i * math.log(10000) / (half - 1))) for i in range(half)]
                + [math.cos(p * math.exp(-i * math.log(10000) / (half - 1))) for i in range(half)]
                for p in range(rows)]  # fmt: skip
    got = _sinusoids.halves(rows, width).double()
    assert float((got - torch.tensor(expected, dtype=torch.float64)).abs().max()) < 1e-5


def test_the_pairs_table_is_the_transformer_papers_angles():
    rows, width = 30, 10
    angle = lambda p, j: p / 10000 ** (2 * (j // 2) / width)
    expected = [[math.sin(angle(p, j)) for j in range(0, width, 2)]
                + [math.cos(angle(p, j)) for j in range(1, width, 2)]
                for p in range(rows)]  # fmt: skip
    got = _sinusoids.pairs(rows, width).double()
    assert float((got - torch.tensor(expected, dtype=torch.float64)).abs().max()) < 1e-5


def xglm(seed: int) -> torch.nn.Module:
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("xglm"))
    return _tiny.random_hf_model(transformers.XGLMForCausalLM, config, seed=seed)


def test_xglm_is_imported_exactly_in_float64():
    reference = xglm(seed=3).double()
    model = HookedTransformer.from_hf(reference)
    table = reference.model.embed_positions.weights  # a buffer, from row 2
    assert torch.equal(model.W_pos[:12], table[2:14])
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # HF's XGLM fills its mask from a default-dtype constant
    try:
        with torch.no_grad():
            expected = reference(TOKENS).logits
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        logits = model(TOKENS)
    assert float((logits - expected).abs().max()) <= 1e-10 * float(expected.abs().max())


def test_xglm_from_its_folder_computes_the_table_no_file_holds(tmp_path):
    reference = xglm(seed=4)
    reference.save_pretrained(tmp_path / "xglm")
    model = HookedTransformer.from_hf(tmp_path / "xglm")
    assert model.verification is not None
    with torch.no_grad():
        expected = reference(TOKENS).logits
        assert float((model(TOKENS) - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
