"""The test hub (tests/helpers/hub.py) against the real `huggingface_hub` client and
transformers, over real sockets on 127.0.0.1: what they fetch, where the cache puts it, what
they make of the hub's errors, and what they do once the hub is gone."""

import os
from pathlib import Path

import huggingface_hub
import pytest
import torch
from helpers.hub import HubRepo, cache_folder, go_offline, serve_hf_model
from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.sha import git_hash

REPO = "org/name"
CONFIG = b'{"model_type": "none"}'
FILES = {
    "config.json": CONFIG,
    "model.safetensors": bytes(range(256)) * 4,
    "tokenizer.json": b'{"version": "1.0"}',
    "README.md": b"# a model\n",
    "extra/notes.txt": b"notes\n",
}


def resolve(repo_id: str, revision: str, path: str) -> str:
    return f"/{repo_id}/resolve/{revision}/{path}"


def test_a_download_lands_in_the_hub_cache_layout(hub):
    repo = hub.add(HubRepo(REPO, {"main": FILES}))
    sha = repo.commit()
    config = hf_hub_download(REPO, "config.json")
    weights = hf_hub_download(REPO, "model.safetensors")

    folder = cache_folder(REPO)
    assert config == str(folder / "snapshots" / sha / "config.json")
    assert (folder / "refs" / "main").read_text() == sha
    # Blobs are named by their ETag: the git oid for small files, the sha256 for LFS files.
    assert os.path.realpath(config) == str(folder / "blobs" / git_hash(CONFIG))
    lfs_etag = repo.snapshot().files["model.safetensors"].sha256
    assert os.path.realpath(weights) == str(folder / "blobs" / lfs_etag)
    assert Path(weights).read_bytes() == FILES["model.safetensors"]
    # The LFS file is sent from the CDN, the way the Hub redirects it.
    assert [(r.method, r.path, r.status, r.origin) for r in hub.log] == [
        ("HEAD", resolve(REPO, "main", "config.json"), 200, "hub"),
        ("GET", resolve(REPO, "main", "config.json"), 200, "hub"),
        ("HEAD", resolve(REPO, "main", "model.safetensors"), 302, "hub"),
        ("GET", f"/lfs/{lfs_etag}", 200, "cdn"),
    ]


def test_a_repo_id_without_an_org(hub):
    hub.add_files("gpt2", {"config.json": CONFIG})
    path = hf_hub_download("gpt2", "config.json")
    assert path.startswith(str(cache_folder("gpt2") / "snapshots"))
    assert hub.requests[0] == ("HEAD", resolve("gpt2", "main", "config.json"))
    assert huggingface_hub.model_info("gpt2").sha == hub.repo("gpt2").commit()


def test_a_file_cached_at_a_commit_is_read_without_a_request(hub):
    sha = hub.add_files(REPO, FILES).commit()
    first = hf_hub_download(REPO, "config.json")
    hub.forget_requests()
    assert hf_hub_download(REPO, "config.json", revision=sha) == first
    assert hub.requests == []
    # By branch name the client asks whether `main` moved, and downloads nothing.
    assert hf_hub_download(REPO, "config.json") == first
    assert hub.requests == [("HEAD", resolve(REPO, "main", "config.json"))]


def test_offline_mode_reads_the_cache_and_asks_nothing(hub, monkeypatch):
    hub.add_files(REPO, FILES)
    path = hf_hub_download(REPO, "config.json")
    hub.forget_requests()
    go_offline(monkeypatch)
    assert hf_hub_download(REPO, "config.json") == path
    # (Online, a file it never cached is asked for 6 times over 23 s of backoff first.)
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(REPO, "tokenizer.json", local_files_only=True)
    assert hub.requests == []


def test_a_stopped_hub_leaves_the_cache(hub):
    hub.add_files(REPO, FILES)
    path = hf_hub_download(REPO, "config.json")
    snapshot = snapshot_download(REPO, allow_patterns="*.md")
    hub.stop()
    assert hf_hub_download(REPO, "config.json", local_files_only=True) == path
    # Online but refused: the client falls back to the cache too.
    assert hf_hub_download(REPO, "config.json") == path
    assert snapshot_download(REPO, allow_patterns="*.md", local_files_only=True) == snapshot
    # (Online, a file it never cached is asked for 6 times over 23 s of backoff first.)
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(REPO, "tokenizer.json", local_files_only=True)


def test_snapshot_download_fetches_only_the_allowed_files(hub):
    sha = hub.add_files(REPO, FILES).commit()
    folder = snapshot_download(REPO, allow_patterns=["*.json", "extra/*"])
    assert folder == str(cache_folder(REPO) / "snapshots" / sha)
    assert sorted(hub.fetched()) == ["config.json", "extra/notes.txt", "tokenizer.json"]
    assert sorted(os.listdir(folder)) == ["config.json", "extra", "tokenizer.json"]
    assert hub.requests[:2] == [
        ("GET", f"/api/models/{REPO}/revision/main"),
        ("GET", f"/api/models/{REPO}/tree/{sha}"),
    ]
    assert hub.log[1].query == {"recursive": ["true"], "expand": ["false"]}


def test_each_revision_has_its_own_snapshot(hub):
    hub.add_files(REPO, FILES)
    repo = hub.add_files(REPO, {"config.json": b'{"v": 1}'}, revision="v1")
    main, v1 = repo.commit("main"), repo.commit("v1")
    assert main != v1
    by_branch = hf_hub_download(REPO, "config.json", revision="v1")
    by_sha = hf_hub_download(REPO, "config.json", revision=main)
    assert by_branch == str(cache_folder(REPO) / "snapshots" / v1 / "config.json")
    assert by_sha == str(cache_folder(REPO) / "snapshots" / main / "config.json")
    assert Path(by_branch).read_bytes() == b'{"v": 1}'
    assert Path(by_sha).read_bytes() == CONFIG
    assert (cache_folder(REPO) / "refs" / "v1").read_text() == v1
    assert huggingface_hub.model_info(REPO, revision="v1").sha == v1


def test_a_cut_download_resumes_with_a_range_request(hub):
    # The client keeps what it received in DOWNLOAD_CHUNK_SIZE pieces (10 MiB), so the
    # cut comes after one piece has arrived.
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    weights = os.urandom(2 * chunk + 12345)
    hub.add_files(REPO, {"model.safetensors": weights})
    hub.cut_download(REPO, "model.safetensors", after_bytes=chunk + 1000)
    path = hf_hub_download(REPO, "model.safetensors")
    assert Path(path).read_bytes() == weights
    gets = [r for r in hub.log if r.method == "GET"]
    assert [(r.status, r.header("Range")) for r in gets] == [(200, None), (206, f"bytes={chunk}-")]


def test_a_gated_repo_wants_its_token(hub, monkeypatch):
    repo = hub.add(HubRepo(REPO, {"main": FILES}, gated=True))
    with pytest.raises(GatedRepoError) as missing:
        hf_hub_download(REPO, "config.json")
    assert missing.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong:
        hf_hub_download(REPO, "config.json", token="hf_not_this_one")
    assert wrong.value.response.status_code == 403
    # What the repo is stays public.
    assert huggingface_hub.model_info(REPO).gated == "auto"

    path = hf_hub_download(REPO, "model.safetensors", token=repo.token)
    assert Path(path).read_bytes() == FILES["model.safetensors"]
    # The token goes to the hub, never to the CDN.
    (head,) = [r for r in hub.log if r.method == "HEAD" and r.status == 302]
    (cdn,) = [r for r in hub.log if r.origin == "cdn"]
    assert head.header("Authorization") == f"Bearer {repo.token}"
    assert cdn.header("Authorization") is None

    monkeypatch.setenv("HF_TOKEN", repo.token)
    assert Path(hf_hub_download(REPO, "config.json")).read_bytes() == CONFIG


def test_a_private_repo_looks_missing_without_its_token(hub):
    repo = hub.add(HubRepo(REPO, {"main": FILES}, private=True))
    with pytest.raises(RepositoryNotFoundError):
        huggingface_hub.model_info(REPO)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(REPO, "config.json")
    assert huggingface_hub.model_info(REPO, token=repo.token).private is True


def test_an_unknown_repo(hub):
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/nothing", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("nothing")
    assert huggingface_hub.repo_exists("org/nothing") is False


def test_an_unknown_revision(hub):
    hub.add_files(REPO, FILES)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="v9")
    with pytest.raises(RevisionNotFoundError):
        huggingface_hub.model_info(REPO, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="0" * 40)


def test_a_missing_file(hub):
    sha = hub.add_files(REPO, FILES).commit()
    with pytest.raises(RemoteEntryNotFoundError) as missing:
        hf_hub_download(REPO, "generation_config.json")
    assert isinstance(missing.value, EntryNotFoundError)
    # The client remembers that the file is missing at this commit.
    assert (cache_folder(REPO) / ".no_exist" / sha / "generation_config.json").is_file()
    assert huggingface_hub.file_exists(REPO, "generation_config.json") is False
    assert huggingface_hub.file_exists(REPO, "extra/notes.txt") is True


def test_model_info_and_a_paginated_file_list(hub):
    repo = hub.add_files(REPO, FILES)
    hub.page_size = 2
    assert sorted(huggingface_hub.list_repo_files(REPO)) == sorted(FILES)
    assert len([r for r in hub.log if "/tree/" in r.path]) == 3  # 5 files and a folder, 2 a page
    info = huggingface_hub.model_info(REPO, files_metadata=True)
    assert info.sha == repo.commit()
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {path: len(content) for path, content in FILES.items()}
    (weights,) = [s for s in info.siblings if s.lfs is not None]
    assert weights.rfilename == "model.safetensors"
    top = {e.path for e in huggingface_hub.list_repo_tree(REPO)}
    assert top == {"README.md", "config.json", "extra", "model.safetensors", "tokenizer.json"}


def tiny_gpt2():
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=50)
    model = transformers.GPT2LMHeadModel(config).to(torch.float64).eval()
    vocab = {f"w{i}": i for i in range(49)} | {"<|endoftext|>": 49}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    return model, tokenizer


def test_transformers_loads_the_served_model(hub, monkeypatch):
    import transformers

    model, tokenizer = tiny_gpt2()
    serve_hf_model(hub, "org/tiny-gpt2", model, tokenizer)
    loaded = transformers.AutoModelForCausalLM.from_pretrained("org/tiny-gpt2", dtype=torch.float64)
    loaded_tokenizer = transformers.AutoTokenizer.from_pretrained("org/tiny-gpt2")
    assert "model.safetensors" in hub.fetched()

    ids = loaded_tokenizer("w3 w17 w5", return_tensors="pt").input_ids
    assert ids.tolist() == [[3, 17, 5]]
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)

    # Once cached, it loads offline without asking anything.
    hub.forget_requests()
    go_offline(monkeypatch)
    again = transformers.AutoModelForCausalLM.from_pretrained("org/tiny-gpt2", dtype=torch.float64)
    transformers.AutoTokenizer.from_pretrained("org/tiny-gpt2")
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert hub.requests == []
