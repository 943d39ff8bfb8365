"""Training an SAE refuses what it cannot learn from, before training: rows with no
variance, rates and widths that are not positive finite numbers, step counts that are not
positive ints."""

import pytest
import torch

from hookedattn import ByteTokenizer
from hookedattn.sae import train_sae
from hookedattn.store import ActivationStore, collect_activations
from hookedattn.testing import random_tiny_model

POINT = "blocks.0.hook_resid_pre"


def test_training_on_constant_activations_is_refused(tmp_path):
    """Guards: train_sae on all-zero rows returned an SAE full of NaN (a zero scale)."""
    model = random_tiny_model(n_ctx=8, d_vocab=259, tokenizer=ByteTokenizer(), attn_only=True)
    with torch.no_grad():
        model.embed.W_E.zero_()
        model.pos_embed.W_pos.zero_()
    collect_activations(model, ["abcdefgh" * 40], names=[POINT], out=tmp_path / "s",
                        batch_size=4, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"no variance .* nothing for an SAE to learn"):
        train_sae(ActivationStore(tmp_path / "s"), POINT, d_sae=8, k=2, steps=2, batch_size=8,
                  progress=False)  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", float("nan")), ("lr", float("inf")), ("lr", 0.0), ("lr", -1e-3),
     ("bandwidth", float("inf")), ("threshold", float("nan"))],
)  # fmt: skip
def test_training_rates_and_widths_are_positive_finite_numbers(tmp_path, field, value):
    """Guards: lr=nan gave torch's 'Invalid learning rate' naming no field, lr=inf trained an
    SAE of NaN, and an inf bandwidth or NaN threshold was taken as it came."""
    model = random_tiny_model(n_ctx=8, d_vocab=259, tokenizer=ByteTokenizer(), attn_only=True)
    collect_activations(model, ["abcdefgh" * 40], names=[POINT], out=tmp_path / "s",
                        batch_size=4, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match=rf"{field} must be a positive number, got .* \(finite\)"):
        train_sae(ActivationStore(tmp_path / "s"), POINT, d_sae=8, l0=0.1, steps=2, batch_size=8,
                  progress=False, **{field: value})  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"), [("log_every", 0), ("checkpoint_every", 0), ("dead_window", -1)]
)
def test_training_step_counts_are_positive_ints(tmp_path, field, value):
    """Guards: log_every=0 and checkpoint_every=0 ended in a ZeroDivisionError mid-training."""
    model = random_tiny_model(n_ctx=8, d_vocab=259, tokenizer=ByteTokenizer(), attn_only=True)
    collect_activations(model, ["abcdefgh" * 40], names=[POINT], out=tmp_path / "s",
                        batch_size=4, progress=False)  # fmt: skip
    extra = {"checkpoint_dir": tmp_path / "checkpoints"} if field == "checkpoint_every" else {}
    with pytest.raises(ValueError, match=rf"{field} must be a positive int.*, got {value}"):
        train_sae(ActivationStore(tmp_path / "s"), POINT, d_sae=8, k=2, steps=2, batch_size=8,
                  progress=False, **{field: value}, **extra)  # fmt: skip
