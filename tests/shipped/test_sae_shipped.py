"""The shipped SAE of the 2-layer model: its stated quality, measured again on held-out text.

Its feature decomposition identities are checked with those of a random SAE at the same
point, in tests/features/test_sae_features.py.
"""

import pytest

from hookedattn import HookedTransformer
from hookedattn.sae import evaluate_sae, list_pretrained_saes, load_pretrained_sae
from hookedattn.sae.shipped import pretrained_sae_record
from hookedattn.store import weights_sha256
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus

MODEL, POINT = "bytes-attn-only-2l", "blocks.1.hook_resid_pre"


def test_listed_and_loadable():
    assert (MODEL, POINT) in list_pretrained_saes()
    sae = load_pretrained_sae(MODEL, POINT)
    assert (sae.cfg.hook_name, sae.cfg.activation, sae.cfg.k) == (POINT, "topk", 16)
    with pytest.raises(
        KeyError, match=r"shipped: \('bytes-attn-only-2l', 'blocks.1.hook_resid_pre'\)"
    ):
        load_pretrained_sae(MODEL, "blocks.0.hook_resid_pre")


def test_heldout_quality_as_stated():
    model = HookedTransformer.from_pretrained(MODEL)
    record = pretrained_sae_record(MODEL, POINT)
    if weights_sha256(model) != record["model_weights_sha256"]:
        # The shipped model was retrained after the SAE: loading against it says so, and
        # the SAE must be retrained with the recorded command.
        with pytest.raises(ValueError, match="retrain it"):
            load_pretrained_sae(MODEL, POINT, model=model)
        return
    sae = load_pretrained_sae(MODEL, POINT, model=model)
    result = evaluate_sae(model, sae, heldout_windows(load_stdlib_corpus().heldout, 64, 128))
    assert result.fve > 0.8 and result.l0 < 32
    assert result.ce_recovered_vs_zero > 0.9
    recorded = record["results"]
    assert abs(float(recorded["fraction of variance explained"]) - result.fve) < 1e-3
    assert abs(float(recorded["loss, SAE spliced (no error term)"]) - result.loss_spliced) < 1e-3


def test_loading_against_other_weights_is_refused():
    other = HookedTransformer.from_pretrained("bytes-attn-only-1l")
    with pytest.raises(ValueError, match="trained on bytes-attn-only-2l with weights sha256"):
        load_pretrained_sae(MODEL, POINT, model=other)


def test_the_shipped_sae_still_loads():
    """The SAE shipped in hookedattn/sae/pretrained/ passes every new check."""
    from hookedattn.sae import list_pretrained_saes, load_pretrained_sae

    for model_name, hook_name in list_pretrained_saes():
        sae = load_pretrained_sae(model_name, hook_name)
        assert sae.cfg.hook_name == hook_name and sae.cfg.reshape_activations == "none"
