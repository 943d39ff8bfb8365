"""Models by name, from a hub on 127.0.0.1 (tests/helpers/hub.py) through the real
`huggingface_hub` client, then from its cache with the hub gone; each compared with
transformers loading the same repo (float32, 1e-5)."""

import io
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from helpers.hub import cache_folder, go_offline, serve_hf_model, tiny_causal_lm, word_tokenizer

import hookedattn_tl
from hookedattn import HookedTransformer
from hookedattn.core.hub import (
    DownloadInterruptedError,
    GatedModelError,
    ModelNotFoundError,
    NotCachedError,
    RevisionNotFoundError,
    official_name,
)

TOKENS = torch.tensor([[3, 17, 5, 9, 1, 44]])
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}


def tiny_llama(seed: int = 0) -> transformers.PreTrainedModel:
    return tiny_causal_lm("llama", seed)


def tiny_gpt2(seed: int = 0) -> transformers.PreTrainedModel:
    return tiny_causal_lm("gpt2", seed)


def tiny_neox(seed: int = 0) -> transformers.PreTrainedModel:
    return tiny_causal_lm("gpt_neox", seed)


def reference_logits(repo_id: str, **hub_options) -> torch.Tensor:
    """What transformers makes of the repo (from the same hub, or its cache)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(repo_id, **hub_options).eval()
    with torch.no_grad():
        return hf(TOKENS).logits


def logits(model: HookedTransformer) -> torch.Tensor:
    with torch.no_grad():
        return model(TOKENS)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


def test_a_repo_loads_then_loads_from_the_cache_with_the_hub_gone(hub, monkeypatch):
    serve_hf_model(hub, "tinyorg/tiny-llama", tiny_llama(), word_tokenizer())
    hub.add_files("tinyorg/tiny-llama", {"README.md": "# tiny", "extra/other.safetensors": b"x"})
    model = HookedTransformer.from_pretrained("tinyorg/tiny-llama")
    # Only what the import reads: the config, the tokenizer, the weights.
    assert set(hub.fetched()) == {"config.json", "model.safetensors", *TOKENIZER_FILES}
    expected = reference_logits("tinyorg/tiny-llama")
    assert_close(logits(model), expected)
    assert model.to_str_tokens("w3 w17") == ["<|endoftext|>", "w3", "w17"]
    assert model.source.repo_id == "tinyorg/tiny-llama"

    hub.stop()
    hub.forget_requests()
    go_offline(monkeypatch)
    again = HookedTransformer.from_pretrained("tinyorg/tiny-llama")
    assert_close(logits(again), expected)
    assert hub.requests == []


def test_a_cached_repo_loads_when_the_hub_cannot_be_reached(hub):
    # A cluster node without network but without HF_HUB_OFFLINE either.
    serve_hf_model(hub, "tinyorg/tiny-llama", tiny_llama(), word_tokenizer())
    expected = logits(HookedTransformer.from_pretrained("tinyorg/tiny-llama"))
    hub.stop()
    assert torch.equal(logits(HookedTransformer.from_pretrained("tinyorg/tiny-llama")), expected)


def test_a_transformerlens_alias_loads_its_repo(hub, monkeypatch):
    repo_id = official_name("gpt2-small")
    assert repo_id == "gpt2"  # TransformerLens 3.5.1's official name
    serve_hf_model(hub, repo_id, tiny_gpt2(), word_tokenizer())
    model = HookedTransformer.from_pretrained("gpt2-small")
    expected = reference_logits(repo_id)
    assert_close(logits(model), expected)
    go_offline(monkeypatch)
    assert_close(logits(HookedTransformer.from_pretrained("GPT2-Small")), expected)


def test_from_hf_loads_a_revision_into_its_own_snapshot(hub, monkeypatch):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(seed=0), word_tokenizer())
    repo = serve_hf_model(hub, "tinyorg/m", tiny_llama(seed=1), word_tokenizer(), revision="v1")
    main, v1 = repo.commit("main"), repo.commit("v1")
    by_branch = HookedTransformer.from_hf("tinyorg/m", revision="v1")
    by_commit = HookedTransformer.from_hf("tinyorg/m", revision=main)
    assert HookedTransformer.from_pretrained("tinyorg/m", revision="v1").source.commit == v1
    assert_close(logits(by_branch), reference_logits("tinyorg/m", revision="v1"))
    assert_close(logits(by_commit), reference_logits("tinyorg/m"))
    assert not torch.allclose(logits(by_branch), logits(by_commit))
    snapshots = cache_folder("tinyorg/m") / "snapshots"
    assert {p.name for p in snapshots.iterdir()} == {main, v1}

    go_offline(monkeypatch)
    assert torch.equal(
        logits(HookedTransformer.from_hf("tinyorg/m", revision="v1")), logits(by_branch)
    )


def test_the_facade_processes_weights_as_transformerlens_does(hub):
    serve_hf_model(hub, "tinyorg/tiny-gpt2", tiny_gpt2(), word_tokenizer())
    expected = reference_logits("tinyorg/tiny-gpt2")
    processed = hookedattn_tl.HookedTransformer.from_pretrained("tinyorg/tiny-gpt2")
    plain = hookedattn_tl.HookedTransformer.from_pretrained_no_processing("tinyorg/tiny-gpt2")
    assert processed.cfg.normalization_type == "LNPre"  # fold_ln
    assert_close(logits(plain), expected)
    # center_unembed shifts each position's logits by a constant: the distribution stays.
    assert_close(logits(processed).log_softmax(-1), expected.log_softmax(-1))
    # TransformerLens's hub keywords are taken, not refused.
    pinned = hookedattn_tl.HookedTransformer.from_pretrained(
        "tinyorg/tiny-gpt2", revision="main", local_files_only=True
    )
    assert_close(logits(pinned), logits(processed))


def test_a_sharded_checkpoint_fetches_the_shards_its_index_names(hub):
    hf = tiny_llama()
    repo_id = "tinyorg/sharded"
    serve_hf_model(hub, repo_id, hf, word_tokenizer(), save={"max_shard_size": "8KB"})
    shards = [p for p in hub.repo(repo_id).revisions["main"] if p.endswith(".safetensors")]
    assert len(shards) > 1
    model = HookedTransformer.from_pretrained(repo_id)
    assert set(hub.fetched()) == {
        "config.json",
        "model.safetensors.index.json",
        *TOKENIZER_FILES,
        *shards,
    }
    assert_close(logits(model), reference_logits(repo_id))


def test_a_repo_of_pickled_weights_loads_them_without_running_code(hub):
    repo_id, hf = "tinyorg/pickled", tiny_gpt2()
    serve_hf_model(hub, repo_id, hf, word_tokenizer())
    # transformers 5 writes safetensors only: the older form of the repo, by hand.
    files = hub.repo(repo_id).revisions["main"]
    state = io.BytesIO()
    torch.save(hf.state_dict(), state)
    files["pytorch_model.bin"] = state.getvalue()
    del files["model.safetensors"]
    with pytest.warns(UserWarning, match="weights_only"):
        model = HookedTransformer.from_pretrained(repo_id)
    assert_close(logits(model), reference_logits(repo_id))


def test_a_repo_that_names_custom_code_is_refused_before_its_weights(hub):
    serve_hf_model(hub, "tinyorg/custom", tiny_gpt2(), word_tokenizer())
    config = hub.repo("tinyorg/custom").revisions["main"]["config.json"].decode()
    config = config.replace('"model_type"', '"auto_map": {"AutoModel": "x.Model"}, "model_type"')
    hub.add_files("tinyorg/custom", {"config.json": config, "x.py": "raise SystemExit"})
    with pytest.raises(Exception, match="custom code"):
        HookedTransformer.from_pretrained("tinyorg/custom")
    assert "x.py" not in hub.fetched()
    assert "model.safetensors" not in hub.fetched()


def test_an_architecture_not_imported_is_named_before_its_weights(hub):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    serve_hf_model(hub, "tinyorg/bert", transformers.BertForMaskedLM(config))
    with pytest.raises(ValueError, match=r"model_type='bert'.*families\.md"):
        HookedTransformer.from_pretrained("tinyorg/bert")
    assert "model.safetensors" not in hub.fetched()


def test_pythia_checkpoints_are_revisions(hub):
    repo_id = official_name("pythia-14m")
    assert repo_id == "EleutherAI/pythia-14m"
    serve_hf_model(hub, repo_id, tiny_neox(seed=0), word_tokenizer())
    serve_hf_model(hub, repo_id, tiny_neox(seed=1), word_tokenizer(), revision="step1000")
    serve_hf_model(hub, repo_id, tiny_neox(seed=2), word_tokenizer(), revision="step4")
    step1000 = reference_logits(repo_id, revision="step1000")
    assert_close(
        logits(HookedTransformer.from_pretrained("pythia-14m", checkpoint_value=1000)), step1000
    )
    # Pythia keeps steps 0, 1, 2, 4, ..., 512, then every 1000: index 3 is step 4.
    step4 = reference_logits(repo_id, revision="step4")
    assert_close(logits(HookedTransformer.from_pretrained("pythia-14m", checkpoint_index=3)), step4)
    with pytest.raises(ValueError, match="1500"):
        HookedTransformer.from_pretrained("pythia-14m", checkpoint_value=1500)


def test_a_gated_repo_asks_for_the_licence_then_a_token(hub):
    repo = serve_hf_model(hub, "tinyorg/gated", tiny_llama(), word_tokenizer(), gated=True)
    with pytest.raises(GatedModelError, match=r"accept its licence.*hf auth login.*no token"):
        HookedTransformer.from_pretrained("tinyorg/gated")
    model = HookedTransformer.from_pretrained("tinyorg/gated", token=repo.token)
    assert_close(logits(model), reference_logits("tinyorg/gated", token=repo.token))


def test_a_gated_repo_refuses_a_token_it_does_not_know(hub):
    serve_hf_model(hub, "tinyorg/gated", tiny_llama(), word_tokenizer(), gated=True)
    with pytest.raises(GatedModelError, match="the token passed was sent"):
        HookedTransformer.from_pretrained("tinyorg/gated", token="hf_someone_else")


def test_an_unknown_repo(hub):
    with pytest.raises(ModelNotFoundError, match=r"no repo 'tinyorg/nothing'.*local folder"):
        HookedTransformer.from_pretrained("tinyorg/nothing")


def test_a_misspelt_transformerlens_name_is_answered_with_the_close_ones(hub):
    with pytest.raises(ModelNotFoundError, match="Did you mean 'gpt2-small'"):
        HookedTransformer.from_pretrained("gpt2-smal")


def test_an_unknown_revision(hub):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    with pytest.raises(RevisionNotFoundError, match=r"no revision 'v9'.*branch, a tag or a commit"):
        HookedTransformer.from_pretrained("tinyorg/m", revision="v9")


def test_offline_and_not_cached_names_the_repo_the_cache_and_the_switch(hub, monkeypatch):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    go_offline(monkeypatch)
    with pytest.raises(NotCachedError) as error:
        HookedTransformer.from_pretrained("tinyorg/m")
    message = str(error.value)
    assert "tinyorg/m at revision 'main'" in message
    assert str(cache_folder("tinyorg/m").parent) in message
    assert "HF_HUB_OFFLINE=1" in message and "unset HF_HUB_OFFLINE" in message
    assert hub.requests == []


def test_local_files_only_reads_the_cache_alone(hub):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    with pytest.raises(NotCachedError, match="local_files_only=True"):
        HookedTransformer.from_pretrained("tinyorg/m", local_files_only=True)
    assert hub.requests == []
    expected = logits(HookedTransformer.from_pretrained("tinyorg/m"))
    hub.forget_requests()
    cached = HookedTransformer.from_pretrained("tinyorg/m", local_files_only=True)
    assert torch.equal(logits(cached), expected)
    assert hub.requests == []


def test_a_download_that_keeps_breaking_says_rerun_and_the_rerun_fetches_the_rest(hub):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    # The client retries 5 times; the sixth cut makes it give up.
    hub.cut_download("tinyorg/m", "model.safetensors", after_bytes=0, times=6)
    with pytest.raises(DownloadInterruptedError, match="run the same load again"):
        HookedTransformer.from_pretrained("tinyorg/m")
    hub.forget_requests()
    model = HookedTransformer.from_pretrained("tinyorg/m")
    assert hub.fetched() == ["model.safetensors"]
    assert_close(logits(model), reference_logits("tinyorg/m"))


def test_a_cache_dir_of_ones_own(hub, tmp_path):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    HookedTransformer.from_pretrained("tinyorg/m", cache_dir=tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / "models--tinyorg--m" / "snapshots").is_dir()
    assert not cache_folder("tinyorg/m").exists()


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hookedattn", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_takes_a_hub_id_and_a_save_pretrained_folder(hub, tmp_path):
    hf = tiny_gpt2()
    serve_hf_model(hub, "tinyorg/tiny-gpt2", hf, word_tokenizer())
    hf.save_pretrained(tmp_path / "saved")
    word_tokenizer().save_pretrained(tmp_path / "saved")
    # The subprocess reads the hub's address and cache from the environment `hub` set.
    by_id = cli("predict", "tinyorg/tiny-gpt2", "w3 w17 w5", "-k", "3")
    by_folder = cli("predict", str(tmp_path / "saved"), "w3 w17 w5", "-k", "3")
    assert by_id.splitlines()[1:] == by_folder.splitlines()[1:]
    with torch.no_grad():
        prompt = torch.tensor([[49, 3, 17, 5]])  # with the BOS the CLI prepends
        top = hf(prompt).logits[0, -1].topk(3).indices.tolist()
    assert [int(line.split(" id ")[1].split()[0]) for line in by_id.splitlines()[2:]] == top


def test_a_folder_that_is_no_model_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(Exception, match=r"no config\.json in .*notes\.txt"):
        HookedTransformer.from_pretrained(tmp_path)


def test_warnings_do_not_escape_a_safetensors_load(hub):
    serve_hf_model(hub, "tinyorg/m", tiny_llama(), word_tokenizer())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HookedTransformer.from_pretrained("tinyorg/m")


def test_a_path_string_is_a_folder_not_a_repo_id(hub, tmp_path):
    hf = tiny_llama()
    folder = tmp_path / "tinyorg" / "m"
    hf.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    model = HookedTransformer.from_pretrained(str(folder))
    assert model.source.kind == "transformers" and model.source.repo_id is None
    assert hub.requests == []
    with torch.no_grad():
        assert_close(logits(model), hf(TOKENS).logits)
    assert Path(model.source.folder) == folder


def test_an_architecture_without_a_family_loads_by_name_verified(hub):
    # SmolLM 3 has no family module: recognised by convention from its config's twin, then
    # verified, then its weights fetched and read (by their names in the files).
    config = transformers.SmolLM3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    serve_hf_model(hub, "tinyorg/smol", transformers.SmolLM3ForCausalLM(config).eval())
    model = HookedTransformer.from_pretrained("tinyorg/smol")
    assert model.verification is not None and model.cfg.rotary_layers is not None
    assert_close(logits(model), reference_logits("tinyorg/smol"))
