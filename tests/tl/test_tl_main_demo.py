"""A TransformerLens Main-Demo-style script runs on hookedattn with one changed import.

The script (tests/tl/tl_main_demo.py) is TransformerLens code: cache, attention patterns,
residual decomposition, logit lens, direct logit attribution, ablation, activation
patching, induction scores, the OV circuit. Here it runs with `import transformer_lens`
replaced by `import hookedattn_tl as transformer_lens`, and its numbers are checked
against facts that hold for any weights.
"""

import pytest
import torch
from torch.testing import assert_close

import hookedattn_tl

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow


def random_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights with nonzero biases and gains, so that every term of every sum matters."""
    model = hookedattn_tl.HookedTransformer(hookedattn_tl.HookedTransformerConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(t.shape, generator=generator) * 0.3 + (name.endswith(".w")))
        for name, t in model.state_dict().items()
    }


@pytest.fixture(scope="module")
def results(main_demo) -> dict:
    namespace = {"weights": random_weights(main_demo.config), "config": main_demo.config}
    exec(compile(main_demo.ported, str(main_demo.path), "exec"), namespace)
    return namespace["results"]


def test_the_demo_ran_on_hookedattn(results):
    assert results["version_module"] == "hookedattn_tl"


def test_decomposition_sums_to_the_final_stream(results):
    decompose, accumulated = results["decompose"], results["accumulated"]
    assert results["decompose_labels"] == [
        "embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"
    ]  # fmt: skip
    assert results["accumulated_labels"] == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    assert_close(decompose.sum(0), accumulated[-1], atol=1e-5, rtol=1e-5)
    assert_close(results["full_decomposition"].sum(0), accumulated[-1], atol=1e-5, rtol=1e-5)
    assert results["full_decomposition_labels"][-3:] == ["embed", "pos_embed", "bias"]


def test_direct_logit_attribution_is_linear_in_the_components(results):
    # DLA per layer and per head: the heads of a layer plus its b_O give that layer's
    # attn_out, so their attributions add up (attribution is linear in the stream).
    per_layer, per_head = results["per_layer_logit_diffs"], results["per_head_logit_diffs"]
    assert per_head.shape == (2, 4)
    total = results["per_layer_logit_diffs"].sum()
    assert_close(total, results["logit_lens_logit_diffs"][-1], atol=1e-5, rtol=1e-5)
    assert results["logit_attrs"].shape == (6, 4)
    assert_close(results["logit_attrs"].mean(-1), per_layer, atol=1e-5, rtol=1e-5)


def test_logit_lens_final_entry_is_the_model_s_own_logits(results, main_demo):
    lens = results["logit_lens_logits"]  # [point batch d_vocab]: ln_final, W_U, b_U
    assert lens.shape == (3, 4, main_demo.config["d_vocab"])
    assert_close(lens[-1], results["last_logits"], atol=1e-4, rtol=1e-5)


def test_patching_the_only_changed_position_restores_the_clean_run(results):
    resid_pre = results["patch_resid_pre"]  # [layer pos]
    assert resid_pre.shape == (2, 12)
    # In block 0, the streams differ only at position 3, where the corrupted token is.
    assert_close(resid_pre[0, 3], torch.tensor(1.0), atol=1e-4, rtol=0)
    others = torch.cat([resid_pre[0, :3], resid_pre[0, 4:]])
    assert_close(others, torch.zeros(11), atol=1e-5, rtol=0)
    assert results["patch_block_every"].shape == (3, 2, 12)
    assert_close(results["patch_block_every"][0], resid_pre)
    assert results["patch_head_all_pos"].shape == (2, 4)
    assert results["patch_head_by_pos"].shape == (2, 12, 4)


def test_ablation_and_induction_scores_are_in_range(results):
    assert results["ablated_loss"] != results["loss"]
    scores = results["induction_scores"]
    assert scores.shape == (2, 4)
    assert bool((scores >= 0).all() and (scores <= 1).all())
    assert results["OV_singular_values"].shape == (8,)
