"""Analysis at expert granularity: each expert's write as a decomposition term (exact sums to
the stream, through the final norm, to the logits), the tokens each expert saw, and expert
usage over an activation store, each against a loop over tokens or the model's own sum.

float64 models with every weight, bias and gain random (`tests/helpers/moe.py`'s, and one
with norms after each sublayer, so that the expert terms pass through `ln2_post`); sums are
checked to 1e-10.
"""

import pytest
import torch
from helpers.moe import TOKENS, moe_by_token, moe_model, one_expert

from analysis import (
    apply_ln_to_stack,
    decompose_resid,
    direct_logit_attribution,
    expert_rows,
    expert_usage,
    expert_writes,
    usage_of_choices,
)
from hookedattn.store import ActivationStore, collect_activations

SHAPES = {
    "routed": {},
    "shared_expert": dict(d_mlp_shared=10, shared_expert_gate=True, norm_topk_prob=True),
    "norms_after_sublayers": dict(normalization_placement="pre_and_post"),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def run(request):
    model = moe_model(**SHAPES[request.param])
    with torch.no_grad():
        logits, cache = model.run_with_cache(TOKENS)
    return model, logits, cache


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-10) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


@pytest.mark.parametrize(("site", "layer"), [("resid_mid", 1), ("resid_post", 0), ("resid_pre", 2)])
def test_the_expert_decomposition_sums_to_the_stream(run, site, layer):
    model, _, cache = run
    decomposition = decompose_resid(model, cache, layer, site, granularity="expert")
    close(decomposition.components.sum(0), cache[decomposition.hook_name])
    assert "L0E5" in decomposition.labels and "L0H3" in decomposition.labels


def test_each_expert_term_is_its_weighted_output_at_its_tokens_and_zero_elsewhere(run):
    model, _, cache = run
    moe, x = model.blocks[0].mlp, cache["blocks.0.ln2.hook_out"]
    writes = expert_writes(model, cache, 0)
    chosen, weights = cache["expert_indices", 0], cache["expert_weights", 0]
    for b in range(TOKENS.shape[0]):
        for p in range(TOKENS.shape[1]):
            for e in range(moe.num_experts):
                slot = (chosen[b, p] == e).nonzero().flatten().tolist()
                expected = (
                    weights[b, p, slot[0]] * one_expert(moe, e, x[b, p])
                    if slot
                    else torch.zeros(model.cfg.d_model, dtype=x.dtype)
                )
                close(writes[e, b, p], expected, atol=1e-12)


def test_the_expert_terms_and_the_shared_expert_are_the_mlps_write(run):
    model, _, cache = run
    decomposition = decompose_resid(model, cache, 1, "resid_post", granularity="expert")
    mlp = [
        label for label in decomposition.labels if label.startswith(("L1E", "L1_shared", "L1_ln2"))
    ]
    close(sum(decomposition[label] for label in mlp), cache["mlp_out", 1])
    # Before any norm after the MLP, the terms are the mixture's output itself.
    raw = expert_writes(model, cache, 1).sum(0)
    if "L1_shared_expert" in decomposition.labels:
        raw = raw + cache["shared_out", 1]
    with torch.no_grad():
        close(raw, moe_by_token(model.blocks[1].mlp, cache["blocks.1.ln2.hook_out"]))


def test_expert_terms_through_the_final_norm_sum_to_its_output(run):
    model, _, cache = run
    decomposition = decompose_resid(model, cache, granularity="expert")
    normed = apply_ln_to_stack(model, cache, decomposition, check=True)
    close(normed.components.sum(0), cache["ln_final.hook_out"])


def test_direct_logit_attribution_with_expert_terms_sums_to_the_logits(run):
    model, logits, cache = run
    decomposition = decompose_resid(model, cache, granularity="expert")
    attribution = direct_logit_attribution(model, cache, decomposition, 3, 7)
    close(attribution.total(), logits[..., 3] - logits[..., 7])
    answers = TOKENS.roll(-1, dims=1)
    by_position = direct_logit_attribution(model, cache, decomposition, answers)
    close(by_position.total(), logits.gather(-1, answers[..., None])[..., 0])
    assert attribution["L1E2"].shape == logits.shape[:2]


def test_the_neuron_granularity_points_a_mixture_to_experts():
    model, cache = moe_model(), None
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="mixtures of experts: use granularity='expert'"):
        decompose_resid(model, cache, granularity="neuron")


def test_expert_rows_give_each_rows_prompt_position_slot_and_weight(run):
    model, _, cache = run
    chosen = cache["expert_indices", 1]
    for e in range(model.cfg.num_experts):
        rows = expert_rows(model, cache, 1, e)
        expected = [(b, p, s) for b in range(2) for p in range(7) for s in range(2)
                    if int(chosen[b, p, s]) == e]  # fmt: skip
        found = zip(rows.batch.tolist(), rows.pos.tolist(), rows.slot.tolist(), strict=True)
        assert list(found) == expected
        close(rows.inputs, cache["blocks.1.ln2.hook_out"][rows.batch, rows.pos], atol=0)
        assert rows.weight.shape == (len(expected),)


def test_rows_of_another_run_are_refused():
    model = moe_model()
    with torch.no_grad():
        _, one = model.run_with_cache(TOKENS)
        _, other = model.run_with_cache(TOKENS.flip(1))
    mixed = {**dict(one.items()), "blocks.0.mlp.hook_expert_indices": other["expert_indices", 0]}
    mixed = type(one)(mixed, one.n_layers)
    lengths = {e: one["expert_out", 0, e].shape[0] for e in range(6)}
    if all(lengths[e] == int((other["expert_indices", 0] == e).sum()) for e in range(6)):
        pytest.skip("the two runs route the same number of tokens to every expert")
    with pytest.raises(ValueError, match="rows but .* tokens were routed"):
        expert_writes(model, mixed, 0)


# ---------------------------------------------------------------- usage over a store
@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    model = moe_model()
    contexts = torch.randint(0, 23, (6, 8), generator=torch.Generator().manual_seed(5))
    out = tmp_path_factory.mktemp("moe_store")
    names = ["blocks.0.mlp.hook_router_logits", "blocks.1.mlp.hook_router_logits"]
    collect_activations(model, contexts, names=names, out=out, context=8, batch_size=2,
                        progress=False)  # fmt: skip
    return model, contexts, ActivationStore(out)


@pytest.mark.parametrize("layer", [0, 1])
def test_expert_usage_over_a_store_counts_every_tokens_choices(stored, layer):
    model, contexts, store = stored
    with torch.no_grad():
        _, cache = model.run_with_cache(contexts)
    chosen = cache["expert_indices", layer].reshape(-1, 2)
    usage = expert_usage(model, store, layer, batch_size=5)
    counts = torch.zeros(6, dtype=torch.long)
    pairs = torch.zeros(6, 6, dtype=torch.long)
    for token in chosen.tolist():
        for e in token:
            counts[e] += 1
            for f in token:
                pairs[e, f] += 1
    assert torch.equal(usage.counts, counts) and torch.equal(usage.pairs, pairs)
    assert usage.n_tokens == contexts.numel()
    assert float(usage.load().sum()) == pytest.approx(1.0)
    assert torch.equal(usage.coactivation().diagonal(), counts.double() / contexts.numel())


def test_usage_of_choices_is_what_expert_usage_adds_up():
    usage = usage_of_choices(torch.tensor([[0, 2], [2, 1], [2, 0]]), 3, 0)
    assert usage.counts.tolist() == [2, 1, 3]
    assert usage.pairs.tolist() == [[2, 0, 2], [0, 1, 1], [2, 1, 3]]
    assert usage.to_table().rows[0][0] == "L0E2"


def test_a_store_without_the_router_logits_is_refused(tmp_path):
    model = moe_model()
    contexts = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(6))
    names = ["blocks.0.mlp.hook_router_logits"]
    collect_activations(model, contexts, names=names, out=tmp_path, context=8, progress=False)
    with pytest.raises(KeyError, match="expert_usage reads blocks.1.mlp.hook_router_logits"):
        expert_usage(model, ActivationStore(tmp_path), 1)
