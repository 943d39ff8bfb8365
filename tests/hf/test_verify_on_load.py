"""Verified on load: before a folder's weights are read, its architecture is checked on a tiny
twin (the checkpoint's config class and structure, few layers, random weights) against
`transformers`, and a pass is remembered per kind of checkpoint.

A broken family is registered through `hookedattn.core.hf.register_family` (the hook a
family of one's own goes through): its table swaps the MLP's gate and up projections, or
reads the final norm's gain from the first layer's. The tests count the twins built by
counting the `DiffLlamaForCausalLM`s constructed. The specimen is DiffLlama (Llama with
differential attention), a family written out, so that every twin counted is the
verification's: a family imported by convention builds twins to recognise its anatomy too,
remembered the same way (tests/hf/test_convention.py). `scripts/coverage.py` is run here too: two
classes quickly, and every registered class (slow).
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("hookedattn.core.hf")

ROOT = Path(__file__).resolve().parents[2]
LLAMA = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29]])
LLAMA_FAMILY = next(f for f in hf.FAMILIES if f.architecture == "DiffLlamaForCausalLM")


@pytest.fixture
def memo(tmp_path, monkeypatch) -> Path:
    """An empty memo of the test's own: no pass remembered by another test counts."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "verified.json"


@pytest.fixture
def llama_folder(tmp_path) -> Path:
    torch.manual_seed(0)
    model = transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**LLAMA)).eval()
    model.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


@pytest.fixture
def twins_built(monkeypatch) -> list[int]:
    """The layer count of every `DiffLlamaForCausalLM` built from here on (each a twin)."""
    built, init = [], transformers.DiffLlamaForCausalLM.__init__

    def counting(self, config, *args, **kwargs):
        built.append(config.num_hidden_layers)
        init(self, config, *args, **kwargs)

    monkeypatch.setattr(transformers.DiffLlamaForCausalLM, "__init__", counting)
    return built


def test_a_folder_is_verified_then_loaded(memo, llama_folder, twins_built):
    model = HookedTransformer.from_hf(llama_folder)
    check = model.verification
    assert (check.architecture, check.remembered) == ("DiffLlamaForCausalLM", False)
    assert check.worst <= 1e-5
    assert twins_built == [2]  # the twin: 2 layers where the checkpoint has 3
    assert model.cfg.n_layers == 3
    passes = json.loads(memo.read_text())["passes"]
    assert passes[check.key]["architecture"] == "DiffLlamaForCausalLM"
    expected = transformers.DiffLlamaForCausalLM.from_pretrained(llama_folder).eval()(TOKENS).logits
    torch.testing.assert_close(model(TOKENS), expected, rtol=0, atol=1e-5)


def test_the_memo_is_used_the_second_time(memo, llama_folder, twins_built):
    first = HookedTransformer.from_hf(llama_folder)
    second = HookedTransformer.from_hf(llama_folder)
    assert len(twins_built) == 1
    assert (first.verification.remembered, second.verification.remembered) == (False, True)
    assert second.verification.key == first.verification.key
    for name, tensor in first.state_dict().items():
        assert torch.equal(second.state_dict()[name], tensor), name


def test_a_checkpoint_of_the_same_structure_reads_the_memo(memo, llama_folder, twins_built,
                                                           tmp_path):  # fmt: skip
    HookedTransformer.from_hf(llama_folder)
    wider = dict(LLAMA, hidden_size=64, num_attention_heads=8, num_key_value_heads=4)
    transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**wider)).save_pretrained(
        tmp_path / "w"
    )
    assert HookedTransformer.from_hf(tmp_path / "w").verification.remembered
    assert len(twins_built) == 2  # the second: the wider model itself, saved above


def test_a_structural_option_is_a_new_kind_of_checkpoint(memo, llama_folder, tmp_path):
    first = HookedTransformer.from_hf(llama_folder).verification
    biased = transformers.DiffLlamaConfig(**LLAMA, attention_bias=True)
    transformers.DiffLlamaForCausalLM(biased).save_pretrained(tmp_path / "b")
    other = HookedTransformer.from_hf(tmp_path / "b").verification
    assert not other.remembered and other.key != first.key


def swapped_gate_and_up(hf_config, cfg, hf_model=None):
    """Llama's table with the MLP's gate and up projections read into each other."""
    table = LLAMA_FAMILY.table(hf_config, cfg, hf_model)
    swap = {"mlp.W_gate": "mlp.W_in", "mlp.W_in": "mlp.W_gate"}

    def swapped(rule):
        end = next((e for e in swap if rule.ours.endswith(e)), None)
        return dataclasses.replace(rule, ours=rule.ours.replace(end, swap[end])) if end else rule

    return dataclasses.replace(table, rules=tuple(map(swapped, table.rules)))


def final_norm_from_layer_0(hf_config, cfg, hf_model=None):
    """Llama's table with the final norm's gain read from layer 0's first norm."""
    table = LLAMA_FAMILY.table(hf_config, cfg, hf_model)
    first = "model.layers.0.input_layernorm.weight"

    def misread(rule):
        return dataclasses.replace(rule, hf=first) if rule.ours == "ln_final.w" else rule

    rules = tuple(map(misread, table.rules))
    return dataclasses.replace(table, rules=rules, ignored=(*table.ignored, r"^model\.norm\."))


BROKEN = {
    "swapped_gate_and_up": (swapped_gate_and_up, r"blocks\.0\.hook_resid_post", "hidden_states[1]"),
    "final_norm_from_layer_0": (final_norm_from_layer_0, r"ln_final\.hook_out", "hidden_states[2]"),
}  # fmt: skip


@pytest.fixture(params=list(BROKEN))
def broken(request):
    """A Llama family with a broken table, registered for the test."""
    table, point, hidden = BROKEN[request.param]
    family = dataclasses.replace(LLAMA_FAMILY, table=table)
    hf.register_family(family)
    request.addfinalizer(lambda: hf.unregister_family(family))
    return point, hidden


def test_a_broken_family_is_refused_naming_the_first_hook_point(memo, llama_folder, broken):
    point, hidden = broken
    before = r"\(the points before it agree: blocks\.0\.hook_resid_pre"
    message = rf"our {point} parts from transformers' {re.escape(hidden)} by [0-9.e+-]+"
    with pytest.raises(hf.VerificationError, match=rf"{message} \(max .*{before}.*No weights"):
        HookedTransformer.from_hf(llama_folder)


def test_the_refusal_comes_before_any_weight_is_read(memo, llama_folder, broken):
    (llama_folder / "model.safetensors").unlink()  # a load would say "no weights"
    with pytest.raises(hf.VerificationError):
        HookedTransformer.from_hf(llama_folder)


def test_a_refusal_is_not_remembered_and_the_built_in_family_still_passes(memo, llama_folder):
    family = dataclasses.replace(LLAMA_FAMILY, table=swapped_gate_and_up)
    hf.register_family(family)
    try:
        with pytest.raises(hf.VerificationError):
            HookedTransformer.from_hf(llama_folder)
        with pytest.raises(hf.VerificationError):  # verified again, not remembered
            HookedTransformer.from_hf(llama_folder)
    finally:
        hf.unregister_family(family)
    assert not memo.exists()
    assert not HookedTransformer.from_hf(llama_folder).verification.remembered


def eps_a_little_off(hf_config):
    """Llama's config translation with every norm's epsilon 1e-5 of itself too large."""
    fields = LLAMA_FAMILY.fields(hf_config)
    return fields | dict(eps=fields["eps"] * (1 + 1e-5))


def test_a_difference_below_float32s_noise_is_refused(memo, llama_folder):
    # The epsilons' 1e-5 moves the stream by 2.4e-6 of its scale (measured): a float32
    # comparison, at float32's noise (1e-4 of the scale), passes it; the float64 run refuses.
    family = dataclasses.replace(LLAMA_FAMILY, fields=eps_a_little_off)
    hf.register_family(family)
    try:
        with pytest.raises(hf.VerificationError, match=r"tolerance 1e-08") as refused:
            HookedTransformer.from_hf(llama_folder)
    finally:
        hf.unregister_family(family)
    relative = float(re.search(r"Δ\|, ([0-9.e+-]+) of its largest", str(refused.value))[1])
    assert 1e-8 < relative < 1e-5


def test_verify_false_skips_the_check(memo, llama_folder, twins_built):
    family = dataclasses.replace(LLAMA_FAMILY, table=swapped_gate_and_up)
    hf.register_family(family)
    try:
        model = HookedTransformer.from_hf(llama_folder, verify=False)
    finally:
        hf.unregister_family(family)
    assert model.verification is None and twins_built == [] and not memo.exists()


def test_verifying_leaves_torchs_random_numbers_as_an_unverified_load_does(memo, llama_folder):
    torch.manual_seed(1)
    HookedTransformer.from_hf(llama_folder, verify=False)
    unverified = torch.rand(4)
    torch.manual_seed(1)
    assert not HookedTransformer.from_hf(llama_folder).verification.remembered  # a twin built
    assert torch.equal(torch.rand(4), unverified)


def test_a_live_model_is_not_verified(memo, twins_built):
    live = transformers.DiffLlamaForCausalLM(transformers.DiffLlamaConfig(**LLAMA)).eval()
    assert HookedTransformer.from_hf(live).verification is None
    assert twins_built == [3]  # the live model itself


def test_the_memo_lives_under_xdg_cache_home(monkeypatch, tmp_path, llama_folder):
    monkeypatch.delenv("HOOKEDATTN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    HookedTransformer.from_hf(llama_folder)
    assert (tmp_path / "xdg" / "hookedattn" / "verified.json").is_file()


def test_unregistering_a_family_never_registered_is_an_error():
    with pytest.raises(ValueError, match="not registered"):
        hf.unregister_family(dataclasses.replace(LLAMA_FAMILY, table=swapped_gate_and_up))


def run_coverage(tmp_path, *args: str) -> dict:
    out = tmp_path / "coverage.json"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "coverage.py"), *args, "--out", str(out),
         "--docs", str(tmp_path / "coverage.md")],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


COUNTS = {
    "registered",
    "builds_tiny",
    "exact",
    "exact_float32_1e5",
    "exact_float64_1e10",
    "verified_on_load",
    "refused",
    "wrong",
    "failed",
    "stopped",
}


def test_the_coverage_sweep_of_two_classes(tmp_path):
    result = run_coverage(tmp_path, "--only", "GPT2LMHeadModel", "LlamaForCausalLM")
    records = result["architectures"]
    assert {r["architecture"] for r in records} == {"GPT2LMHeadModel", "LlamaForCausalLM"}
    assert {"gpt2", "llama"} <= {r["model_type"] for r in records}
    assert set(result["counts"]) == COUNTS
    counts = result["counts"]
    assert counts["registered"] == len(records) == counts["exact"] == counts["verified_on_load"]
    for record in records:
        assert record["builds_tiny"] and record["generation"] == "equal", record
        # Loaded from its folder, each passes the float64 verification (EXAONE's files keep
        # its layers as `transformer.h`).
        assert record["verified"]["worst"] <= 1e-12, record
        assert record["delta_float32"] <= 1e-4 and record["delta_float64"] <= 1e-12, record
        # Stock HF rounds its RMSNorms to float32 in a float64 Llama: float64 throughout does not.
        stock_rounds = record["architecture"] == "LlamaForCausalLM"
        assert (record["delta_float64_stock"] > 1e-9) == stock_rounds, record
    page = (tmp_path / "coverage.md").read_text()
    assert f"| import exactly | {len(records)} |" in page
    assert "| `GPT2LMHeadModel` | gpt2 |" in page


@pytest.mark.slow
def test_the_whole_coverage_sweep_matches_the_committed_page(tmp_path):
    # Every registered architecture (about 4 minutes on 2 cores): none imported wrongly or
    # failing, every exact import's folder verified on load, every refusal ours and named,
    # and the counts the families table and the coverage page state
    # (scripts/data/coverage.json) still true.
    result = run_coverage(tmp_path)
    counts, records = result["counts"], result["architectures"]
    committed = json.loads((ROOT / "scripts" / "data" / "coverage.json").read_text())
    assert counts["registered"] == len(records) == committed["counts"]["registered"]
    assert counts["builds_tiny"] == sum(r.get("builds_tiny", False) for r in records)
    assert counts["wrong"] == counts["failed"] == counts["stopped"] == 0, records
    assert counts["exact"] == committed["counts"]["exact"], counts
    for record in records:
        assert record.get("builds_tiny") or record["why_not"]
        if record.get("status") == "exact" and record["folder"]:  # its folder verifies too
            assert record["verified"]["status"] == "passed", record
        if record.get("status") == "refused":
            message = record["message"]
            assert message.startswith(("ValueError", "CheckpointError", "VerificationError"))
