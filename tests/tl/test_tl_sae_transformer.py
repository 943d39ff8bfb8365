"""hookedattn_tl.HookedSAETransformer: SAELens 6's SAE methods over our splice.

Each run is held against the same SAE written into a hook by hand from its weights (`acts =
relu((x - b_dec) W_enc + b_enc)`, `recons = acts W_dec + b_dec`, plus `x - recons` with the
error term), on a tiny seeded float64 model; the slow test at the end holds the whole
SAELens workflow against SAELens 6.54.12 itself (scripts/saelens_probes.py in its own
environment, `.ci/saelens.sh`), on the same weights.
"""

import sys

import pytest
import torch
from helpers.saelens_reference import VERSION, run_in_saelens
from helpers.tl_reference import assert_same, script_module
from torch.testing import assert_close

import hookedattn_tl
from hookedattn.sae import SAEConfig, SparseAutoencoder, load_pretrained_sae
from hookedattn.testing import random_tiny_model
from hookedattn_tl import HookedSAETransformer

POINT = "blocks.1.hook_resid_pre"
SAE_NAMES = ("input", "acts_pre", "acts_post", "recons", "error", "output")
TOKENS = torch.tensor([[1, 5, 2, 7, 3, 3], [4, 4, 0, 6, 2, 1]])
# Two float64 computations of the same sums, ordered alike.
EXACT = dict(rtol=0, atol=1e-12)


def make_model() -> HookedSAETransformer:
    return random_tiny_model(
        model_class=HookedSAETransformer, n_heads=2, d_head=8, d_mlp=24, n_ctx=24, d_vocab=12
    ).eval()


def make_sae(point: str = POINT, seed: int = 2) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(16, 40, point, dtype="float64", seed=seed))
    with torch.no_grad():
        sae.b_enc.add_(0.1)
        sae.b_dec.normal_(generator=torch.Generator().manual_seed(seed + 3))
    return sae


def by_hand(model, sae, use_error_term, edit=None):
    """The model with the SAE written into a hook at its point by hand: `(logits, parts)`,
    the SAE's intermediate values by SAELens's names. `edit` changes the features."""
    parts = {}

    def replace(x, hook):
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        acts = pre.relu()
        clean = acts @ sae.W_dec + sae.b_dec
        acts = acts if edit is None else edit(acts)
        recons = acts @ sae.W_dec + sae.b_dec
        out = recons + (x - clean) if use_error_term else recons
        parts.update(input=x, acts_pre=pre, acts_post=acts, recons=recons, output=out)
        if use_error_term:
            parts["error"] = x - clean
        return out

    with torch.no_grad():
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[(sae.cfg.hook_name, replace)])
    return logits, parts


def sae_keys(cache, point=POINT):
    return [name for name in list(cache) if name.startswith(point + ".")]


# ---------------------------------------------------------------- running with SAEs
@pytest.mark.parametrize("use_error_term", [False, True])
def test_run_with_cache_with_saes_is_the_sae_written_into_the_hook(use_error_term):
    model, sae = make_model(), make_sae()
    with torch.no_grad():
        logits, cache = model.run_with_cache_with_saes(
            TOKENS, saes=[sae], use_error_term=use_error_term
        )
    expected, parts = by_hand(model, sae, use_error_term)
    assert_close(logits, expected, **EXACT)
    names = [n for n in SAE_NAMES if use_error_term or n != "error"]
    assert sae_keys(cache) == [f"{POINT}.hook_sae_{n}" for n in names]  # SAELens's order
    for name in names:
        assert_close(cache[f"{POINT}.hook_sae_{name}"], parts[name], **EXACT)
    assert_close(cache[POINT], parts["output"], **EXACT)  # the point sees the SAE's output
    assert isinstance(cache, hookedattn_tl.ActivationCache)
    assert model.acts_to_saes == {} and not sae_keys(model.hook_dict)


def test_the_error_term_leaves_the_logits_unchanged():
    model, sae = make_model(), make_sae()
    clean = model(TOKENS)
    logits, cache = model.run_with_cache_with_saes(TOKENS, saes=sae, use_error_term=True)
    assert_close(logits, clean, **EXACT)
    acts = cache[f"{POINT}.hook_sae_acts_post"]
    assert acts.shape == (2, 6, 40) and (acts > 0).any()
    without = model.run_with_saes(TOKENS, saes=[sae])  # reconstruction only: SAELens's default
    assert (without - clean).abs().max() > 1e-3


def test_an_edited_feature_acts_through_the_error_term():
    model, sae = make_model(), make_sae()
    model.add_sae(sae, use_error_term=True)

    def zero_first(acts, hook=None):
        acts = acts.clone()
        acts[..., :5] = 0.0
        return acts

    hook = (f"{POINT}.hook_sae_acts_post", zero_first)
    with torch.no_grad():
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[hook])
    model.reset_saes()
    expected, _ = by_hand(model, sae, True, edit=zero_first)
    assert_close(logits, expected, **EXACT)


@pytest.mark.parametrize("point", ["hook_sae_acts_pre", "hook_sae_acts_post"])
def test_a_feature_edited_in_place_acts_through_the_error_term(point):
    # SAELens's tutorials ablate with `acts[:, :, f] = 0; return acts`: the same tensor back.
    # Zeroing a pre-activation zeroes its ReLU feature too.
    model, sae = make_model(), make_sae()
    model.add_sae(sae, use_error_term=True)

    def zero_first(acts, hook):
        acts[..., :5] = 0.0
        return acts

    with torch.no_grad():
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[(f"{POINT}.{point}", zero_first)])
    model.reset_saes()

    def edit(acts):
        acts = acts.clone()
        acts[..., :5] = 0.0
        return acts

    expected, _ = by_hand(model, sae, True, edit=edit)
    assert_close(logits, expected, **EXACT)
    assert (logits - model(TOKENS)).abs().max() > 1e-3


def test_run_with_hooks_with_saes_reaches_the_sae_points():
    model, sae = make_model(), make_sae()
    seen = []
    hook = (f"{POINT}.hook_sae_acts_post", lambda acts, hook: seen.append(hook.name))
    model.run_with_hooks_with_saes(TOKENS, saes=[sae], fwd_hooks=[hook])
    assert seen == [f"{POINT}.hook_sae_acts_post"]
    assert not model.acts_to_saes and not model.attached_hooks()


# ---------------------------------------------------------------- attaching and resetting
def test_reset_saes_restores_the_original_logits_exactly():
    model, a, b = make_model(), make_sae(), make_sae("blocks.0.hook_resid_post", seed=4)
    clean, names = model(TOKENS), list(model.hook_dict)
    model.add_sae(a)
    model.add_sae(b, use_error_term=True)
    assert model.acts_to_saes == {POINT: a, "blocks.0.hook_resid_post": b}
    assert not torch.equal(model(TOKENS), clean)
    model.reset_saes(POINT)
    assert model.acts_to_saes == {"blocks.0.hook_resid_post": b}
    assert_close(model(TOKENS), clean, **EXACT)  # b carries its error term
    model.reset_saes()
    assert torch.equal(model(TOKENS), clean)
    assert list(model.hook_dict) == names and not model.attached_hooks()
    assert a.hook_acts.name == "hook_acts"  # the SAE's own names are back


def test_reset_saes_of_a_point_without_one_warns(caplog):
    model = make_model()
    model.reset_saes("blocks.0.hook_resid_pre")
    assert "No SAE is attached to blocks.0.hook_resid_pre" in caplog.text


def test_add_sae_replaces_the_sae_at_its_point():
    model, a, b = make_model(), make_sae(), make_sae(seed=7)
    model.add_sae(a)
    model.add_sae(b)
    assert model.acts_to_saes == {POINT: b}
    logits = model(TOKENS)
    model.reset_saes()
    assert_close(logits, by_hand(model, b, False)[0], **EXACT)


def test_use_error_term_none_reads_the_sae_s_own_setting():
    model, sae = make_model(), make_sae()
    clean = model(TOKENS)
    sae.use_error_term = True  # SAELens's (deprecated) per-SAE setting
    assert_close(model.run_with_saes(TOKENS, saes=[sae]), clean, **EXACT)
    without = model.run_with_saes(TOKENS, saes=[sae], use_error_term=False)
    assert_close(without, by_hand(model, sae, False)[0], **EXACT)


def test_the_context_manager_restores_what_it_displaced():
    model, a, b = make_model(), make_sae(), make_sae(seed=7)
    model.add_sae(a, use_error_term=True)
    with model.saes([b, make_sae("blocks.0.hook_resid_post", seed=4)]) as same:
        assert same is model and set(model.acts_to_saes) == {POINT, "blocks.0.hook_resid_post"}
        assert model.acts_to_saes[POINT] is b
    assert model.acts_to_saes == {POINT: a}
    assert f"{POINT}.hook_sae_error" in model.hook_dict  # a with its error term again
    with model.saes([b], reset_saes_end=False):
        pass
    assert model.acts_to_saes == {POINT: b}


def test_the_context_manager_cleans_up_on_an_exception():
    model, sae = make_model(), make_sae()
    clean, names = model(TOKENS), list(model.hook_dict)
    with pytest.raises(RuntimeError, match="inside"), model.saes([sae]):
        assert model.acts_to_saes == {POINT: sae}
        raise RuntimeError("inside")
    assert not model.acts_to_saes and list(model.hook_dict) == names
    assert torch.equal(model(TOKENS), clean) and not model.attached_hooks()
    # an SAE that cannot be attached: the ones attached before it are removed again
    wrong = SparseAutoencoder(SAEConfig(16, 8, "blocks.0.hook_resid_pre"))  # float32
    with pytest.raises(ValueError, match="float32"), model.saes([sae, wrong]):
        pass
    assert not model.acts_to_saes and list(model.hook_dict) == names


def test_a_refused_sae_leaves_the_one_there():
    model, sae = make_model(), make_sae()
    model.add_sae(sae)
    with pytest.raises(ValueError, match="d_in=8"):
        model.add_sae(SparseAutoencoder(SAEConfig(8, 4, POINT, dtype="float64")))
    assert model.acts_to_saes == {POINT: sae} and f"{POINT}.hook_sae_input" in model.hook_dict


def test_refused_arguments_are_named():
    model = make_model()
    with pytest.raises(KeyError, match="did you mean 'blocks.1.hook_resid_pre'"):
        model.add_sae(make_sae("blocks.1.hook_resid_pr"))
    with pytest.raises(ValueError, match="exclude_special_tokens=True"):
        model.add_sae(make_sae(), exclude_special_tokens=True)
    with pytest.raises(TypeError, match="replaced"):
        model.add_sae(torch.nn.Linear(2, 2))
    assert not model.acts_to_saes and not model.attached_hooks()


# ---------------------------------------------------------------- what would lose the SAEs
def test_a_flag_assignment_and_reset_hooks_keep_the_saes():
    model, sae = make_model(), make_sae()
    model.add_sae(sae, use_error_term=True)
    model.add_hook(f"{POINT}.hook_sae_acts_post", lambda acts, hook: None)
    model.cfg.use_attn_result = True
    assert model.acts_to_saes == {POINT: sae}
    logits, cache = model.run_with_cache(TOKENS)
    assert "blocks.0.attn.hook_result" in cache and f"{POINT}.hook_sae_error" in cache
    model.reset_hooks(including_permanent=True)
    assert model.acts_to_saes == {POINT: sae} and len(model.attached_hooks()) == 1  # the splice
    model.reset_saes()
    assert_close(model(TOKENS), logits, **EXACT)


def test_a_copy_has_copies_of_the_saes():
    model, sae = make_model(), make_sae()
    model.add_sae(sae, use_error_term=True)
    copied = model.copy()
    (copied_sae,) = copied.acts_to_saes.values()
    assert copied_sae is not sae and torch.equal(copied_sae.W_enc, sae.W_enc)
    assert model.acts_to_saes == {POINT: sae}
    assert_close(copied(TOKENS), model(TOKENS), **EXACT)
    copied.reset_saes()
    assert model.acts_to_saes == {POINT: sae} and f"{POINT}.hook_sae_input" in model.hook_dict


def test_analysis_splices_as_on_any_model():
    # analysis's feature patching splices with hookedattn.sae.spliced (our names, the error
    # term), not with the `saes()` this class redefines as SAELens's.
    from analysis.patching.feature_patching import feature_activation_patch

    model, sae = make_model(), make_sae()
    plain = hookedattn_tl.HookedTransformer(model.cfg)
    plain.load_state_dict(model.state_dict())
    corrupted = TOKENS.flip(-1)
    metric = lambda logits: logits[:, -1, 3]
    ours = feature_activation_patch(model, sae, TOKENS, corrupted, metric, features=[0, 5])
    theirs = feature_activation_patch(plain, sae, TOKENS, corrupted, metric, features=[0, 5])
    assert torch.equal(ours.per_prompt, theirs.per_prompt) and not model.acts_to_saes


def test_from_pretrained_with_a_shipped_sae():
    model = HookedSAETransformer.from_pretrained_no_processing("bytes-attn-only-2l")
    assert type(model) is HookedSAETransformer
    sae = load_pretrained_sae("bytes-attn-only-2l", "blocks.1.hook_resid_pre", model=model)
    tokens = model.to_tokens("The quick brown fox")
    clean = model(tokens)
    logits, cache = model.run_with_cache_with_saes(tokens, saes=[sae], use_error_term=True)
    assert_close(logits, clean, rtol=1e-5, atol=1e-5)
    assert cache["blocks.1.hook_resid_pre.hook_sae_acts_post"].shape[-1] == sae.cfg.d_sae


def test_the_alias_reaches_it():
    hookedattn_tl.install()
    try:
        import transformer_lens

        assert transformer_lens.HookedSAETransformer is HookedSAETransformer
        module = sys.modules["transformer_lens.HookedSAETransformer"]
        assert module.HookedSAETransformer is HookedSAETransformer
    finally:
        hookedattn_tl.uninstall()


# ---------------------------------------------------------------- against SAELens itself
def _spec(kind, hook_name, d_in, d_sae, seed, k=None, reshape="none"):
    generator = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=generator) * 0.3
    weights = dict(W_enc=draw(d_in, d_sae), W_dec=draw(d_sae, d_in), b_dec=draw(d_in))
    weights["b_enc"] = draw(d_sae) + 0.1
    return dict(
        kind=kind, hook_name=hook_name, d_in=d_in, d_sae=d_sae, k=k,
        reshape_activations=reshape, weights=weights,
    )  # fmt: skip


@pytest.fixture(scope="module")
def saelens_setup():
    config = dict(
        n_layers=2, d_model=16, n_ctx=12, d_head=4, n_heads=4, d_mlp=32, d_vocab=20,
        act_fn="gelu", normalization_type="LN",
    )  # fmt: skip
    reference = hookedattn_tl.HookedTransformer(hookedattn_tl.HookedTransformerConfig(**config))
    generator = torch.Generator().manual_seed(0)
    weights = {
        name: torch.randn(t.shape, generator=generator) * 0.3 + name.endswith(".w")
        for name, t in reference.state_dict().items()
    }
    saes = [
        _spec("standard", "blocks.0.hook_resid_post", 16, 48, seed=1),
        _spec("topk", "blocks.1.hook_mlp_out", 16, 40, seed=2, k=6),
        _spec("standard", "blocks.1.attn.hook_z", 16, 32, seed=3, reshape="hook_z"),
    ]
    tokens = torch.randint(0, 20, (3, 10), generator=torch.Generator().manual_seed(1))
    return dict(config=config, weights=weights, tokens=tokens, saes=saes)


@pytest.mark.slow
def test_the_saelens_workflow_matches_saelens(saelens_setup, tmp_path):
    theirs = run_in_saelens("saelens_probes.py", saelens_setup, tmp_path)
    assert theirs["version"] == VERSION
    probes = script_module("saelens_probes")
    ours = probes.probes(probes.hookedattn_api(), saelens_setup)
    theirs = theirs["probes"]
    points = {spec["hook_name"] for spec in saelens_setup["saes"]}
    z_sae = "blocks.1.attn.hook_z"
    for use_error_term in (False, True):
        key = f"cache/error={use_error_term}"
        ours_cache, their_cache = ours.pop(key), theirs.pop(key)
        # SAELens swaps the point for the SAE; here the point stays, seeing the SAE's output
        # (and each norm's output, `hook_out`, is cached, which TL does not have).
        extra = set(ours_cache) - set(their_cache)
        assert {name for name in extra if not name.endswith("ln1.hook_out")} >= points
        assert all(name in points or name.endswith(".hook_out") for name in extra)
        # SAELens adds `mlp.hook_in`, the MLP's input: here the second norm's output.
        for layer in range(saelens_setup["config"]["n_layers"]):
            their_in = their_cache.pop(f"blocks.{layer}.mlp.hook_in")
            assert_same(ours_cache[f"blocks.{layer}.ln2.hook_out"], their_in, "mlp.hook_in")
        assert set(their_cache) <= set(ours_cache)
        for point in points - {z_sae}:
            assert_same(ours_cache[point], their_cache[f"{point}.hook_sae_output"], point)
        # On hook_z, our error and output are flat, [... (head d_head)] (module docstring).
        for name in (f"{z_sae}.hook_sae_error", f"{z_sae}.hook_sae_output"):
            if name in their_cache:
                flat = their_cache.pop(name).flatten(-2)
                assert_same(ours_cache.pop(name), flat, name)
        assert_same({k: ours_cache[k] for k in their_cache}, their_cache, key)
    assert_same(ours, theirs, "probes")
