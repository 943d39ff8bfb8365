"""SAELens's tutorial on loading and analysing an SAE (scripts/saelens_tutorial.py) agrees
with real SAELens 6.54.12.

A local hub (tests/helpers/hub.py) serves tiny stand-ins under the names the tutorial loads:
`gpt2` (what "gpt2-small" resolves to, for TransformerLens 3.5.1 and here), a 12-layer
GPT-2 of width 32 with random weights and a byte-level BPE tokenizer trained on the
tutorial's sentences, and `jbloom/GPT2-Small-SAEs-Reformatted` with the SAE folder that
SAELens's registry names for `gpt2-small-res-jb` / `blocks.8.hook_resid_pre` (a pre-6.0
`cfg.json`, `sae_weights.safetensors`, `sparsity.safetensors`), of width 64 on the model's
32. The tutorial's text runs twice, each side loading both by name over HTTP into a cache of
its own: under SAELens 6.54.12 and TransformerLens 3.5.1 in their own environment (the port
lines put back, the alias line removed; scripts/tl_demo.py, a subprocess), and here after
the alias line. Every printed line must read the same, token ids and feature indices equal,
every printed number within one unit of its last digit or the float32 tolerance of
`helpers.tl_reference` (2e-5, relative to the largest entry), and the tensors it keeps too.
"""

import json
import random

import pytest
import safetensors.torch
import torch
from helpers.hub import HubServer, folder_files, use_hub
from helpers.saelens_reference import VERSION, require_saelens_python
from helpers.tl_reference import (
    DEMO_CORPUS,
    NUMBER,
    ROOT,
    assert_same,
    assert_same_printout,
    run_script,
    save_demo_tokenizer,
    script_module,
)

import hookedattn_tl

TUTORIAL = ROOT / "scripts" / "saelens_tutorial.py"
ALIAS_LINE = "import hookedattn_tl.as_transformer_lens  # noqa: F401  (the alias line)\n"
PORTED = "# SAELens: "
SAE_REPO = "jbloom/GPT2-Small-SAEs-Reformatted"
SAE_FOLDER = "blocks.8.hook_resid_pre"
D_MODEL, D_SAE = 32, 64
ANNOUNCED = "Loaded pretrained model gpt2-small into HookedTransformer\n"


def saelens_text(source: str) -> str:
    """The tutorial as SAELens wrote it: without the alias line, and each ported line
    replaced by the original its `# SAELens: ` comment gives."""
    assert ALIAS_LINE in source
    lines, original = [], None
    for line in source.replace(ALIAS_LINE, "").splitlines():
        code = line.lstrip()
        if code.startswith(PORTED):
            original = line[: len(line) - len(code)] + code[len(PORTED) :]
        elif original is not None:
            lines.append(original)
            original = None
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def tutorial_texts() -> list[str]:
    """The stand-in for NeelNanda/pile-10k: 24 texts of 4 of the tokenizer's sentences."""
    draw = random.Random(0)
    return [" ".join(draw.choices(DEMO_CORPUS, k=4)) for _ in range(24)]


def gpt2_files(folder) -> dict[str, bytes]:
    """A 12-layer GPT-2 (GPT-2 small's depth, width 32) with every weight drawn at random
    and the demos' tokenizer, as transformers saves them (plus the hub's `n_ctx`)."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    save_demo_tokenizer(folder)
    config = GPT2Config(
        n_layer=12, n_head=4, n_embd=D_MODEL, n_positions=64,
        vocab_size=len(AutoTokenizer.from_pretrained(folder)), bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = (name.startswith("transformer.ln") or ".ln_" in name) and "weight" in name
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + gain)
    model.save_pretrained(folder)
    # The hub's gpt2 config.json has `n_ctx` too, which TransformerLens 3.5.1 reads.
    config_file = folder / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"n_ctx": 64}))
    return folder_files(folder)


def sae_files(folder) -> dict[str, bytes]:
    """The SAE folder in the release's layout: a pre-6.0 SAELens `cfg.json` (the fields
    jbloom's GPT-2 small SAEs carry), the four weights and the log10 feature densities."""
    generator = torch.Generator().manual_seed(1)
    W_dec = torch.randn(D_SAE, D_MODEL, generator=generator)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
    weights = {
        "W_enc": W_dec.T.contiguous() + 0.1 * torch.randn(D_MODEL, D_SAE, generator=generator),
        "W_dec": W_dec,
        "b_enc": torch.randn(D_SAE, generator=generator) * 0.5 - 0.5,
        "b_dec": torch.randn(D_MODEL, generator=generator) * 0.1,
    }
    cfg = {
        "model_name": "gpt2-small", "hook_point": SAE_FOLDER, "hook_point_layer": 8,
        "hook_point_head_index": None, "dataset_path": "Skylion007/openwebtext",
        "is_dataset_tokenized": False, "context_size": 24, "use_cached_activations": False,
        "d_in": D_MODEL, "d_sae": D_SAE, "expansion_factor": D_SAE // D_MODEL,
        "b_dec_init_method": "geometric_median", "l1_coefficient": 8e-05, "lr": 0.0004,
        "device": "cpu", "seed": 42, "dtype": "torch.float32", "prepend_bos": True,
    }  # fmt: skip
    safetensors.torch.save_file(weights, str(folder / "sae_weights.safetensors"))
    sparsity = {"sparsity": torch.randn(D_SAE, generator=generator) - 3.0}
    safetensors.torch.save_file(sparsity, str(folder / "sparsity.safetensors"))
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return {f"{SAE_FOLDER}/{name}": data for name, data in folder_files(folder).items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict, dict]:
    python = require_saelens_python()
    source = TUTORIAL.read_text()
    namespace = {"texts": tutorial_texts()}
    folders = {n: tmp_path_factory.mktemp(n) for n in ("gpt2", "sae", "theirs", "ours")}
    fetched = {}
    with HubServer() as hub, pytest.MonkeyPatch.context() as patch:
        hub.add_files("gpt2", gpt2_files(folders["gpt2"]))
        hub.add_files(SAE_REPO, {"README.md": b"# SAEs\n"} | sae_files(folders["sae"]))
        given = {
            "source": saelens_text(source), "namespace": namespace,
            "filename": str(TUTORIAL), "package": "sae_lens",
        }  # fmt: skip
        home = folders["theirs"] / "hf-home"
        env = dict(
            HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_CACHE=str(home / "hub"),
            HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
            NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
        )  # fmt: skip
        theirs = run_script(python, "tl_demo.py", given, folders["theirs"], env)
        fetched["theirs"] = sorted(hub.fetched(SAE_REPO))
        hub.forget_requests()
        use_hub(patch, hub.url, folders["ours"] / "hf-home")
        hookedattn_tl.install()
        try:
            ours = script_module("tl_demo").run_demo(source, namespace, str(TUTORIAL))
        finally:
            hookedattn_tl.uninstall()
        fetched["ours"] = sorted(hub.fetched(SAE_REPO))
    return ours, theirs, fetched


def test_each_side_loaded_the_sae_by_release_name_from_the_hub(runs):
    ours, theirs, fetched = runs
    assert theirs["version"] == VERSION
    wanted = {f"{SAE_FOLDER}/cfg.json", f"{SAE_FOLDER}/sae_weights.safetensors"}
    assert wanted <= set(fetched["theirs"]) and wanted <= set(fetched["ours"])
    assert f"SAE: {SAE_FOLDER} ({D_MODEL}, {D_SAE}) 24 True" in ours["printed"]


def test_every_printed_number_agrees_with_saelens(runs):
    ours, theirs, _ = runs
    # TransformerLens's from_pretrained announces itself on stdout; ours is silent.
    assert theirs["printed"].count(ANNOUNCED) == 2  # the two models the tutorial loads
    theirs = theirs["printed"].replace(ANNOUNCED, "")
    numbers = assert_same_printout(ours["printed"], theirs)
    assert numbers >= 150
    # Counts, ranks, feature indices, shapes: the integers are equal, not one unit apart.
    integers = lambda text: [n for n in NUMBER.findall(text) if "." not in n]
    assert integers(ours["printed"]) == integers(theirs)


def test_the_kept_tensors_agree(runs):
    ours, theirs, _ = runs
    assert_same(ours["results"], theirs["results"], "results")
    # Which features fire on which tokens of the batch: the same.
    firing = lambda results: results["feature_acts"] > 0
    assert torch.equal(firing(ours["results"]), firing(theirs["results"]))
