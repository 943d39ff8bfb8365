"""TransformerLens's toy models (`attn-only-2l`, `gelu-2l`, `solu-1l`) in TL's own format,
served from a hub on 127.0.0.1, loaded by name by hookedattn and by real TransformerLens
3.5.1 (in its own environment, through its own hub client): the same logits.

TL writes the files (`scripts/tl_hub_toys.py make`: its own state dicts, buffers and all,
with seeded random parameters), the test serves them with a config.json in the fields of
the real repos, and TL loads them back by name (`load`) from the same hub."""

import io
import json

import pytest
import torch
from helpers.hub import go_offline, serve_hf_model, word_tokenizer
from helpers.tl_reference import assert_same, run_in_tl

import hookedattn_tl
from hookedattn import HookedTransformer
from hookedattn.core.hub import official_name

pytestmark = pytest.mark.slow

TOKENIZER_REPO = "NeelNanda/gpt-neox-tokenizer-digits"
SHAPE = dict(d_model=16, d_head=4, n_heads=4, d_mlp=32, n_ctx=16, d_vocab=50)
# name: (n_layers, act_fn, attn_only, shortformer_pos)
TOYS = {
    "attn-only-2l": (2, "solu_ln", True, True),
    "gelu-2l": (2, "gelu", False, True),
    "solu-1l": (1, "solu_ln", False, False),
}
CHECKPOINT = 1000  # solu-1l also keeps the checkpoint at this step
TOKENS = torch.tensor([[49, 3, 17, 5, 9, 1, 44, 2]])


def tl_config(n_layers: int, act_fn: str, attn_only: bool, shortformer: bool) -> dict:
    """The model as TransformerLens's HookedTransformerConfig takes it."""
    return dict(
        **SHAPE,
        n_layers=n_layers,
        act_fn=act_fn,
        attn_only=attn_only,
        normalization_type="LN",
        positional_embedding_type="shortformer" if shortformer else "standard",
        dtype=torch.float32,
    )


def repo_config(n_layers: int, act_fn: str, attn_only: bool, shortformer: bool) -> bytes:
    """config.json as the toy models' repos hold it: their training run's fields."""
    fields = dict(
        **SHAPE,
        n_layers=n_layers,
        act_fn=act_fn,
        attn_only=attn_only,
        normalization="LN",
        shortformer_pos=shortformer,
        tokenizer_name=TOKENIZER_REPO,
        lr=1e-3,
        batch_size=32,
        seed=0,
    )
    return json.dumps(fields).encode()


def pickled(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


@pytest.fixture
def served(hub, tmp_path):
    """The toy models and their tokenizer on the hub: {name: repo_id}."""
    files = {
        f"{name}/final": {"config": tl_config(*spec), "seed": i}
        for i, (name, spec) in enumerate(TOYS.items())
    }
    files["solu-1l/checkpoint"] = {"config": tl_config(*TOYS["solu-1l"]), "seed": 99}
    written = run_in_tl("tl_hub_toys.py", {"make": files}, tmp_path)
    repos = {}
    for name, spec in TOYS.items():
        repo_id = official_name(name)
        model_file = repo_id.split("/")[-1]
        content = {
            "config.json": repo_config(*spec),
            "model_final.pth": pickled(written[f"{name}/final"]),
        }
        if name == "solu-1l":
            content[f"checkpoints/{model_file}_{CHECKPOINT}.pth"] = pickled(
                written["solu-1l/checkpoint"]
            )
        hub.add_files(repo_id, content)
        repos[name] = repo_id
    serve_hf_model(hub, TOKENIZER_REPO, None, word_tokenizer())
    return repos


def transformerlens_answers(tmp_path) -> dict:
    """TL's loads by name, from the same hub into a cache of its own."""
    home = tmp_path / "tl-home"
    env = dict(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", HF_HOME=str(home))
    env["HF_HUB_CACHE"] = str(home / "hub")
    asked = {"names": list(TOYS), "tokens": TOKENS, "checkpoints": {"solu-1l": CHECKPOINT}}
    return run_in_tl("tl_hub_toys.py", {"load": asked}, tmp_path, env=env)


def test_the_toy_models_load_by_name_as_transformerlens_loads_them(
    served, hub, tmp_path, monkeypatch
):
    theirs = transformerlens_answers(tmp_path)
    for name, repo_id in served.items():
        model = HookedTransformer.from_pretrained(name)
        with torch.no_grad():
            assert_same(model(TOKENS), theirs[name]["raw"], f"{name} unprocessed")
        assert model.to_tokens("w3 w17")[0].tolist() == theirs[name]["ids"], name
        in_float64 = HookedTransformer.from_pretrained(name, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(
                in_float64(TOKENS), theirs[name]["raw64"], atol=1e-12, rtol=0, msg=name
            )
        processed = hookedattn_tl.HookedTransformer.from_pretrained(name)
        assert processed.cfg.normalization_type == theirs[name]["processed_normalization"], name
        with torch.no_grad():
            assert_same(processed(TOKENS), theirs[name]["processed"], f"{name} processed")
        assert model.source.repo_id == repo_id

    at = HookedTransformer.from_pretrained("solu-1l", checkpoint_value=CHECKPOINT)
    with torch.no_grad():
        assert_same(at(TOKENS), theirs["solu-1l"]["checkpoint"], "solu-1l at its checkpoint")

    # Then from the cache alone, the hub gone.
    hub.stop()
    hub.forget_requests()
    go_offline(monkeypatch)
    again = HookedTransformer.from_pretrained("attn-only-2l")
    with torch.no_grad():
        assert_same(again(TOKENS), theirs["attn-only-2l"]["raw"], "attn-only-2l offline")
    assert hub.requests == []
