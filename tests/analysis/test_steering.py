"""Steering vectors against hooks written by hand and activations cached one prompt at a
time; a steered generation against the same hooks in `run_with_hooks`."""

import pytest
import torch

from analysis import SteeringVector, steering_sweep
from hookedattn import ByteTokenizer
from hookedattn.sae import SAEConfig, SparseAutoencoder
from hookedattn.store import weights_sha256
from hookedattn.testing import random_tiny_model

TOL = dict(rtol=1e-10, atol=1e-10)
POSITIVE = ["I love it", "so happy", "great day"]
NEGATIVE = ["I hate it", "so sad", "awful"]


@pytest.fixture(scope="module")
def model():
    return random_tiny_model(tokenizer=ByteTokenizer(), d_vocab=259, n_ctx=40, scale=0.3)


def activation(model, text, name, position):
    """One prompt's activation at `name`, cached alone."""
    _, cache = model.run_with_cache(model.to_tokens(text), names_filter=name)
    acts = cache[name][0]
    return acts.mean(0) if position == "mean" else acts[position]


@pytest.mark.parametrize("position", [-1, 1, "mean"])
def test_difference_of_means_equals_one_prompt_at_a_time(model, position):
    v = SteeringVector.from_difference_of_means(model, POSITIVE, NEGATIVE, "resid_pre", 1, position)
    name = "blocks.1.hook_resid_pre"
    mean = lambda texts: torch.stack([activation(model, t, name, position) for t in texts]).mean(0)
    torch.testing.assert_close(v.vector, mean(POSITIVE) - mean(NEGATIVE), **TOL)
    assert v.hook_name == name and v.provenance["positive"] == POSITIVE
    assert v.provenance["model_weights_sha256"] == weights_sha256(model)


def test_actadd_is_the_pair_difference_position_by_position(model):
    v = SteeringVector.from_prompt_pair(model, "Love", "Hate it", "resid_pre", 1)
    name = "blocks.1.hook_resid_pre"
    plus = model.run_with_cache(model.to_tokens("Love   "), names_filter=name)[1][name][0]
    minus = model.run_with_cache(model.to_tokens("Hate it"), names_filter=name)[1][name][0]
    torch.testing.assert_close(v.vector, plus - minus, **TOL)  # "Love" padded with spaces
    assert v.aligned and v.vector.shape == (8, model.cfg.d_model)


def test_an_sae_feature_steers_along_its_decoder_direction(model):
    sae = SparseAutoencoder(SAEConfig(d_in=16, d_sae=8, hook_name="blocks.0.hook_resid_post"))
    v = SteeringVector.from_sae_feature(sae.double(), 3)
    assert v.hook_name == "blocks.0.hook_resid_post"
    torch.testing.assert_close(v.vector, sae.W_dec[3].detach(), rtol=0, atol=0)


# ---------------------------------------------------------------- applying
def by_hand(vector, scale, positions):
    """The hook written out: add `scale * vector` at the listed positions."""

    def hook(x, hook):
        x = x.clone()
        for p in positions:
            if p < x.shape[1]:
                x[:, p] += scale * (vector[p] if vector.ndim == 2 else vector)
        return x

    return hook


def test_hooks_add_the_scaled_vector_at_the_positions_asked_for(model):
    v = SteeringVector(torch.randn(16, dtype=torch.float64), "resid_mid", 0)
    tokens = model.to_tokens("hello world")
    for positions, where in [("all", range(12)), ([2, 5], [2, 5]), ("prompt", range(12))]:
        steered = model.run_with_hooks(tokens, fwd_hooks=v.hooks(3.0, positions))
        expected = model.run_with_hooks(
            tokens, fwd_hooks=[("blocks.0.hook_resid_mid", by_hand(v.vector, 3.0, where))]
        )
        torch.testing.assert_close(steered, expected, **TOL)
    generated = model.run_with_hooks(tokens, fwd_hooks=v.hooks(3.0, "generated"))
    torch.testing.assert_close(generated, model(tokens), **TOL)  # no generated position here


def test_an_aligned_vector_adds_row_i_at_position_i(model):
    v = SteeringVector.from_prompt_pair(model, "Love", "Hate", "resid_pre", 1)
    tokens = model.to_tokens("I think you are")
    steered = model.run_with_hooks(tokens, fwd_hooks=v.hooks(2.0))
    expected = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.1.hook_resid_pre", by_hand(v.vector, 2.0, range(5)))]
    )
    torch.testing.assert_close(steered, expected, **TOL)


def test_layers_move_the_vector_to_the_same_site_in_other_blocks(model):
    v = SteeringVector(torch.randn(16, dtype=torch.float64), "resid_pre", 1)
    assert [name for name, _ in v.hooks(layers=[0, 1])] == [
        "blocks.0.hook_resid_pre",
        "blocks.1.hook_resid_pre",
    ]
    full = SteeringVector(v.vector, "blocks.1.hook_resid_pre")
    with pytest.raises(ValueError, match="cannot move to layer 0"):
        full.hooks(layers=[0])


@pytest.mark.parametrize("positions", ["all", "generated"])
def test_a_steered_generation_is_the_same_hook_in_run_with_hooks(model, positions):
    v = SteeringVector.from_difference_of_means(model, POSITIVE, NEGATIVE, "resid_pre", 1)
    prompt = model.to_tokens("well, ")
    n_prompt = prompt.shape[1]
    with model.hooks(fwd_hooks=v.hooks(6.0, positions)):
        steps = list(model.generate_steps(prompt, 6, stop_at_eos=False, names_filter=[]))
    tokens = torch.cat([prompt, torch.stack([s.tokens for s in steps], dim=1)], dim=1)
    where = range(40) if positions == "all" else range(n_prompt, 40)
    logits = model.run_with_hooks(tokens[:, :-1], fwd_hooks=v.hooks(6.0, list(where)))
    for i, step in enumerate(steps):
        torch.testing.assert_close(step.logits, logits[:, n_prompt - 1 + i], **TOL)
    unsteered = model.generate(prompt, 6, stop_at_eos=False)
    assert not torch.equal(tokens, unsteered)


def test_run_with_cache_inside_the_hooks_caches_the_steered_stream(model):
    v = SteeringVector(torch.randn(16, dtype=torch.float64), "resid_post", 0)
    tokens = model.to_tokens("abc")
    _, plain = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    with model.hooks(fwd_hooks=v.hooks(2.0)):
        _, steered = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    torch.testing.assert_close(steered["resid_post", 0], plain["resid_post", 0] + 2 * v.vector)


def test_a_vector_of_the_wrong_shape_is_refused_when_it_runs(model):
    v = SteeringVector(torch.zeros(7, dtype=torch.float64), "resid_pre", 0)
    with pytest.raises(ValueError, match=r"the steering vector is \(7,\) per position"):
        model.run_with_hooks(model.to_tokens("a"), fwd_hooks=v.hooks())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(site="pattern", layer=0), "steer an activation with one position axis"),
        (dict(site="resid_pre", layer=0, aligned=True), "an aligned vector is"),
    ],
)
def test_bad_steering_vectors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SteeringVector(torch.zeros(16), **kwargs)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_vector_that_is_not_finite_is_refused(value):
    vector = torch.zeros(16)
    vector[3] = value
    with pytest.raises(ValueError, match="1 values that are not finite"):
        SteeringVector(vector, "resid_pre", 0)


def test_a_complex_vector_is_refused():
    with pytest.raises(TypeError, match="complex vector would lose its imaginary part"):
        SteeringVector(torch.zeros(16, dtype=torch.complex64), "resid_pre", 0)


@pytest.mark.parametrize(
    ("scale", "error"),
    [(float("nan"), ValueError), (float("inf"), ValueError), (True, TypeError), (1j, TypeError)],
)
def test_a_scale_that_is_not_a_finite_real_number_is_refused(scale, error):
    v = SteeringVector(torch.zeros(16), "resid_pre", 0)
    with pytest.raises(error, match="scale must be"):
        v.hooks(scale)


def test_a_sweep_metric_that_returns_a_vector_is_refused(model):
    v = SteeringVector(torch.zeros(model.cfg.d_model), "resid_pre", 0)
    with pytest.raises(ValueError, match=r"the metric returned a tensor of shape \(1, 3\)"):
        steering_sweep(model, v, "ab", [1.0], lambda logits: logits[:, :, 0])


def test_bad_positions_are_refused():
    v = SteeringVector(torch.zeros(16), "resid_pre", 0)
    with pytest.raises(ValueError, match="positions must be 'all', 'prompt', 'generated'"):
        v.hooks(positions="last")


# ---------------------------------------------------------------- files and sweeps
def test_a_saved_vector_loads_with_its_provenance(model, tmp_path):
    v = SteeringVector.from_difference_of_means(model, POSITIVE, NEGATIVE, "resid_pre", 1)
    loaded = SteeringVector.load(v.save(tmp_path / "v.safetensors"), model=model)
    assert torch.equal(loaded.vector, v.vector)
    assert (loaded.site, loaded.layer, loaded.aligned) == ("resid_pre", 1, False)
    assert loaded.provenance == v.provenance


def test_loading_for_other_weights_is_refused(model, tmp_path):
    v = SteeringVector.from_difference_of_means(model, POSITIVE, NEGATIVE, "resid_pre", 1)
    path = v.save(tmp_path / "v.safetensors")
    other = model.copy()
    with torch.no_grad():
        other.W_E[0, 0] += 1
    with pytest.raises(ValueError, match="made from a model with weights sha256"):
        SteeringVector.load(path, model=other)


def test_a_sweep_reports_the_metric_and_the_kl_at_each_scale(model):
    v = SteeringVector.from_difference_of_means(model, POSITIVE, NEGATIVE, "resid_pre", 1)
    tokens = model.to_tokens(["today was", "he said"], padding_side="left")
    mask = model.tokenize(["today was", "he said"], padding_side="left").attention_mask
    metric = lambda logits: logits[:, -1, 101].mean()  # the logit of "e"
    sweep = steering_sweep(model, v, tokens, [0.0, 2.0, 5.0], metric, attention_mask=mask)
    clean = model(tokens, attention_mask=mask).log_softmax(-1)
    for i, scale in enumerate([0.0, 2.0, 5.0]):
        logits = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=v.hooks(scale))
        steered = logits.log_softmax(-1)
        kl = (clean.exp() * (clean - steered)).sum(-1)
        expected_kl = kl[mask.bool()].mean()
        torch.testing.assert_close(sweep.kl[i], expected_kl, **TOL)
        torch.testing.assert_close(sweep.metric[i], metric(logits).double(), **TOL)
    assert sweep.kl[0] == 0 and sweep.kl[2] > sweep.kl[1] > 0
