"""Weight processing: each step is a new model computing what it says it preserves."""

import pytest
import torch
from torch.testing import assert_close

from hookedattn import (
    CharTokenizer,
    HookedTransformer,
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model

DTYPES = [torch.float32, torch.float64]
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])


def make_model(norm="LN", attn_only=False, dtype=torch.float64, **overrides):
    """A model whose every parameter (gains and biases included) is random."""
    fields = dict(n_heads=2, d_head=4, d_mlp=32, n_ctx=8, d_vocab=12)
    fields |= dict(normalization_type=norm, attn_only=attn_only, dtype=dtype)
    return random_tiny_model(scale=0.3, **{**fields, **overrides})


def transformed(transform, model):
    """`transform(model)`, checked to be a new model that left `model` exactly as it was."""
    before = {name: t.clone() for name, t in model.state_dict().items()}
    new = transform(model)
    assert new is not model
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
    return new


VARIANTS = [
    pytest.param(
        norm, attn_only, dtype, id=f"{norm}-{'attn_only' if attn_only else 'mlp'}-{str(dtype)[6:]}"
    )
    for norm in ("LN", "RMS")
    for attn_only in (True, False)
    for dtype in DTYPES
]


# ---------------------------------------------------------------- function preserved
# Each fold, and what it changes besides leaving the logits as they were.
FOLDS = {
    "fold_layer_norm": (
        fold_layer_norm,
        lambda folded, norm: (
            folded.cfg.normalization_type == {"LN": "LNPre", "RMS": "RMSPre"}[norm]
        ),
    ),
    "fold_value_biases": (fold_value_biases, lambda folded, norm: (folded.b_V == 0).all()),
}


@pytest.mark.parametrize("fold", FOLDS)
@pytest.mark.parametrize(("norm", "attn_only", "dtype"), VARIANTS)
def test_folds_preserve_logits(fold, norm, attn_only, dtype):
    transform, changed = FOLDS[fold]
    model = make_model(norm, attn_only, dtype)
    folded = transformed(transform, model)
    assert changed(folded, norm)
    assert_close(folded(TOKENS), model(TOKENS), **tolerance(dtype).as_kwargs())


@pytest.mark.parametrize(("norm", "attn_only", "dtype"), VARIANTS)
def test_center_unembed_preserves_log_probs(norm, attn_only, dtype):
    model = make_model(norm, attn_only, dtype)
    centred = transformed(center_unembed, model)
    tol = tolerance(dtype).as_kwargs()
    new, old = centred(TOKENS), model(TOKENS)
    assert_close(new.log_softmax(-1), old.log_softmax(-1), **tol)
    shift = old - new  # one constant per position
    assert_close(shift, shift[..., :1].expand_as(shift), **tol)
    assert shift.abs().max() > 1e-3  # logits themselves did move
    assert_close(centred.W_U.mean(-1), torch.zeros(16, dtype=dtype), **tol)


@pytest.mark.parametrize("attn_only", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_center_writing_weights_preserves_logits_of_layer_norm_models(attn_only, dtype):
    model = make_model("LN", attn_only, dtype)
    centred = transformed(center_writing_weights, model)
    tol = tolerance(dtype).as_kwargs()
    assert_close(centred(TOKENS), model(TOKENS), **tol)
    _, cache = centred.run_with_cache(TOKENS)
    for layer in range(2):  # the residual stream now has zero mean
        resid = cache["resid_post", layer]
        assert_close(resid.mean(-1), torch.zeros(resid.shape[:-1], dtype=dtype), **tol)


@pytest.mark.parametrize("norm", ["RMS", "RMSPre", None])
def test_center_writing_weights_refuses_models_whose_readers_see_the_mean(norm):
    model = make_model(norm)
    with pytest.raises(ValueError, match=f"normalization_type={norm!r}"):
        center_writing_weights(model)


def test_center_writing_weights_would_change_an_rms_model():
    # Why the refusal: RMSNorm does not subtract the mean, so centring changes the output.
    model = make_model("RMS")
    with torch.no_grad():
        model.embed.W_E -= model.embed.W_E.mean(-1, keepdim=True)
    assert (make_model("RMS")(TOKENS) - model(TOKENS)).abs().max() > 1e-3


@pytest.mark.parametrize(("norm", "attn_only", "dtype"), VARIANTS)
def test_process_weights_preserves_log_probs(norm, attn_only, dtype):
    model = make_model(norm, attn_only, dtype)
    processed = transformed(process_weights, model)
    tol = tolerance(dtype).as_kwargs()
    assert_close(processed(TOKENS).log_softmax(-1), model(TOKENS).log_softmax(-1), **tol)
    assert (processed.b_V == 0).all()
    assert_close(processed.W_U.mean(-1), torch.zeros(16, dtype=dtype), **tol)
    if norm == "LN":  # writing weights centred, reading weights centred
        assert_close(processed.W_E.mean(-1), torch.zeros(12, dtype=dtype), **tol)
        assert_close(processed.W_Q.mean(-2), torch.zeros(2, 2, 4, dtype=dtype), **tol)


@pytest.mark.parametrize(
    "variant",
    [
        dict(positional_embedding_type="rotary"),
        dict(use_split_qkv_input=True, use_attn_result=True),
        dict(use_attn_in=True),
    ],
    ids=["rotary", "split_qkv", "attn_in"],
)
def test_process_weights_on_other_variants(variant):
    model = make_model("LN", **variant)
    processed = process_weights(model)
    tol = tolerance(torch.float64).as_kwargs()
    assert_close(processed(TOKENS).log_softmax(-1), model(TOKENS).log_softmax(-1), **tol)


def test_process_weights_on_a_model_without_norms():
    model = make_model(None)
    processed = process_weights(model)  # folds and centring that do not apply are skipped
    assert_close(processed.W_E, model.W_E)
    tol = tolerance(torch.float64).as_kwargs()
    assert_close(processed(TOKENS).log_softmax(-1), model(TOKENS).log_softmax(-1), **tol)


def test_process_weights_steps_can_be_turned_off():
    model = make_model("LN")
    only_fold = process_weights(
        model, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    assert only_fold.cfg.normalization_type == "LNPre"
    assert_close(only_fold.W_E, model.W_E)  # writing weights not centred
    assert_close(only_fold.b_O, model.b_O)  # value biases not folded into b_O
    assert (only_fold.b_V != 0).any()


# ---------------------------------------------------------------- what changes and what not
def test_fold_layer_norm_keeps_activations_other_than_the_norms_output():
    model = make_model("LN")
    _, old = model.run_with_cache(TOKENS)
    _, new = fold_layer_norm(model).run_with_cache(TOKENS)
    tol = tolerance(torch.float64).as_kwargs()
    for name in ("blocks.1.attn.hook_q", "blocks.1.attn.hook_v", "blocks.1.mlp.hook_pre"):
        assert_close(new[name], old[name], **tol)
    assert_close(new["scale", 1, "ln1"], old["scale", 1, "ln1"], **tol)
    # hook_normalized is before the gain and bias, so folding them away leaves it alone;
    # the norm's output after them (hook_out) is what moves.
    assert_close(new["normalized", 1, "ln1"], old["normalized", 1, "ln1"], **tol)
    moved = new["blocks.1.ln1.hook_out"] - old["blocks.1.ln1.hook_out"]
    assert moved.abs().max() > 1e-3


def test_fold_value_biases_keeps_attn_out_and_changes_z():
    model = make_model("LN")
    _, old = model.run_with_cache(TOKENS)
    _, new = fold_value_biases(model).run_with_cache(TOKENS)
    tol = tolerance(torch.float64).as_kwargs()
    assert_close(new["attn_out", 0], old["attn_out", 0], **tol)
    assert (new["z", 0] - old["z", 0]).abs().max() > 1e-3


def test_fold_value_biases_with_padding():
    # Padding queries still attend to something, so every pattern row sums to one.
    model = make_model("LN")
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    tol = tolerance(torch.float64).as_kwargs()
    expected = model(TOKENS, attention_mask=mask)
    assert_close(fold_value_biases(model)(TOKENS, attention_mask=mask), expected, **tol)


def test_fold_layer_norm_refuses_a_model_without_norms():
    with pytest.raises(ValueError, match="no normalisation layers"):
        fold_layer_norm(make_model(None))


def test_fold_layer_norm_twice_is_fold_once():
    model = make_model("LN")
    once = fold_layer_norm(model)
    twice = fold_layer_norm(once)
    for name, tensor in once.state_dict().items():
        assert_close(twice.state_dict()[name], tensor, **tolerance(torch.float64).as_kwargs())


def test_new_model_keeps_tokenizer_and_mode_and_the_global_rng():
    model = HookedTransformer(make_model("LN").cfg, tokenizer=CharTokenizer("abcdefghi"))
    model.eval()
    torch.manual_seed(5)
    state = torch.get_rng_state()
    processed = process_weights(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert processed.tokenizer is model.tokenizer
    assert not processed.training
    assert processed.cfg.seed == model.cfg.seed
