"""The induction report's feature section (scripts/induction/features.py)."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from analysis.induction import PERIOD, repeated_tokens
from hookedattn import HookedTransformer
from hookedattn.sae import load_pretrained_sae
from hookedattn.sae.shipped import pretrained_sae_record
from hookedattn.store import weights_sha256

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "induction" / "features.py"
_spec = importlib.util.spec_from_file_location("induction_features", SCRIPT)
section = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(section)


@pytest.fixture(scope="module")
def model():
    model = HookedTransformer.from_pretrained(section.MODEL)
    record = pretrained_sae_record(section.MODEL, section.POINT)
    if weights_sha256(model) != record["model_weights_sha256"]:
        pytest.skip("the shipped SAE predates the shipped model: retrain it (docs/guide/saes.md)")
    return model


@pytest.fixture(scope="module")
def measured(model):
    sae = load_pretrained_sae(section.MODEL, section.POINT, model=model)
    return sae, section.measure(model, sae, repeated_tokens(n_seq=4), PERIOD)


def test_the_features_attribution_adds_up_and_is_ranked(measured):
    _, r = measured
    assert r.max_error < 1e-3 * max(1.0, abs(r.logit))  # float32 sums of ~10^2 terms
    assert sum(r.groups.values()) == pytest.approx(r.logit, rel=1e-4, abs=1e-4)
    assert set(r.groups) >= {"all features", "sae_b_dec", "sae_error", "L1_attn", "b_U"}
    scores = [f.attribution for f in r.features]
    assert len(scores) == section.N_FEATURES and scores == sorted(scores, reverse=True)
    for f in r.features:  # contexts from the store, strongest first, the token marked
        values = [value for _, value in f.contexts]
        assert values and values == sorted(values, reverse=True) and values[-1] > 0
        assert all(text.endswith("]]") and "[[" in text for text, _ in f.contexts)


def test_section_markdown_and_insertion(measured, tmp_path):
    sae, r = measured
    text = section._markdown(r, sae)
    assert text.startswith("## Features at the input of layer 1")
    rows = re.findall(r"^\| F\d+ \| [+-]\d\.\d{3} \|", text, flags=re.MULTILINE)
    assert len(rows) == section.N_FEATURES
    report = tmp_path / "report.md"
    report.write_text("# Report\n\n## Findings\n\nx\n\n## Thresholds\n\n- t\n")
    section.insert_section(report, text)
    written = report.read_text()
    assert written.index("## Findings") < written.index(text) < written.index("## Thresholds")
    bare = tmp_path / "bare.md"
    bare.write_text("# Report\n")
    section.insert_section(bare, text)
    assert bare.read_text() == "# Report\n\n" + text + "\n"


def test_a_stale_sae_is_reported_not_measured():
    other = HookedTransformer.from_pretrained(section.MODEL)
    with torch.no_grad():
        other.blocks[0].attn.W_O.mul_(1.5)  # other weights, same shapes
    text = section.feature_section(other, repeated_tokens(n_seq=2), PERIOD)
    assert "Not measured" in text and "retrain it" in text
