"""Collected rows equal the activations of a plain `run_with_cache`, read back every way."""

import pytest
import torch

from hookedattn import ByteTokenizer, HookedTransformer
from hookedattn.store import (
    ActivationStore,
    StoreError,
    collect_activations,
    load_sweep,
    pack,
    sweep,
)
from hookedattn.testing import random_tiny_model

RESID = "blocks.1.hook_resid_pre"
PATTERN = "blocks.0.attn.hook_pattern"
TEXTS = ["def f(x):\n    return x + 1\n" * 6, "class A:\n    pass\n" * 9]


def byte_model(seed: int = 0) -> HookedTransformer:
    fields = dict(n_heads=2, d_head=8, n_ctx=8, d_vocab=259, attn_only=True)
    return random_tiny_model(seed, randomize_seed=seed, tokenizer=ByteTokenizer(), **fields)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    model = byte_model()
    out = tmp_path_factory.mktemp("store")
    kwargs = dict(names=[RESID, PATTERN], out=out, batch_size=3, shard_contexts=6)
    collection = collect_activations(model, TEXTS, **kwargs, progress=False)
    return model, out, collection, kwargs


def test_rows_are_the_cached_activations_context_after_context(collected):
    model, out, _, _ = collected
    store = ActivationStore(out)
    contexts = pack(model, TEXTS).contexts(0, len(pack(model, TEXTS)))
    _, cache = model.run_with_cache(contexts, names_filter=[RESID, PATTERN])
    torch.testing.assert_close(store.rows(RESID, slice(None)), cache[RESID].reshape(-1, 16).float())
    pattern = cache[PATTERN].permute(0, 2, 1, 3).reshape(-1, 2, 8).float()  # query position = row
    torch.testing.assert_close(store.rows(PATTERN, slice(None)), pattern)
    assert store.rows(RESID, slice(None)).dtype == torch.float32


def test_every_row_traces_back_to_its_context_position_and_token(collected):
    model, out, _, _ = collected
    store = ActivationStore(out)
    contexts = pack(model, TEXTS).contexts(0, len(store) // 8)
    rows = torch.tensor([0, 9, 17, len(store) - 1])
    origin = store.origin(rows)
    assert origin.context.tolist() == (rows // 8).tolist()
    assert origin.position.tolist() == (rows % 8).tolist()
    assert origin.token.tolist() == contexts.reshape(-1)[rows].tolist()


def test_shards_split_the_contexts_as_the_manifest_says(collected):
    _, out, collection, _ = collected
    store = ActivationStore(out)
    n_contexts = store.manifest["packing"]["n_contexts"]
    assert [s["contexts"] for s in store.manifest["shards"]] == [
        [a, min(a + 6, n_contexts)] for a in range(0, n_contexts, 6)
    ]
    assert collection.written == tuple(range(collection.n_shards)) and store.complete


def test_stats_are_the_float64_mean_and_variance_of_the_model_activations(collected):
    model, out, _, _ = collected
    store = ActivationStore(out)
    contexts = pack(model, TEXTS).contexts(0, len(store) // 8)
    _, cache = model.run_with_cache(contexts, names_filter=[RESID])
    rows = cache[RESID].reshape(-1, 16)
    stats = store.stats(RESID)
    assert stats.count == rows.shape[0]
    torch.testing.assert_close(stats.mean, rows.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(stats.var, rows.var(0, unbiased=False), rtol=0, atol=1e-12)


def test_shuffled_batches_hold_every_row_once_in_an_order_set_by_the_seed(collected):
    _, out, _, _ = collected
    store = ActivationStore(out)
    everything = store.rows(RESID, slice(None))

    def epoch(seed):
        return torch.cat(list(store.batches(RESID, 10, shuffle=True, seed=seed, window=2)))

    first, again, other = epoch(0), epoch(0), epoch(1)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first, everything)
    key = lambda t: sorted(map(tuple, t.tolist()))
    assert key(first) == key(everything) == key(other)
    assert [b.shape[0] for b in store.batches(RESID, 10, drop_last=True)] == [10] * (
        len(store) // 10
    )
    assert torch.equal(torch.cat(list(store.batches(RESID, 7))), everything)


def test_a_dataloader_reads_the_store_as_a_dataset(collected):
    _, out, _, _ = collected
    store = ActivationStore(out)
    dataset = store.to_torch_dataset(RESID)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=False)
    assert len(dataset) == len(store)
    assert torch.equal(next(iter(loader)), store.rows(RESID, slice(0, 16)))


def test_a_model_with_other_weights_is_refused_by_hash(collected):
    model, out, _, _ = collected
    ActivationStore(out, model=model)  # the same weights: accepted
    with pytest.raises(StoreError, match=r"weights sha256 .* this model's weights hash to"):
        ActivationStore(out, model=byte_model(seed=1))


def test_the_repr_names_the_state_shapes_and_dtype(collected):
    _, out, _, _ = collected
    text = repr(ActivationStore(out))
    assert "complete" in text and f"{RESID}  [row d_model=16]  float32" in text
    assert f"{PATTERN}  [row head=2 key_pos=8]" in text and "MiB on disk" in text


def test_collecting_again_with_the_same_arguments_writes_nothing(collected):
    model, out, collection, kwargs = collected
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = collect_activations(model, TEXTS, **kwargs, progress=False)
    assert again.written == () and again.resumed == collection.written
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sweep_in_one_process_is_the_loop_over_items_with_labels(tmp_path):
    # The same under torchrun, with activation patching, is in test_store_distributed.py.
    model = byte_model()
    prompts = torch.randint(0, 256, (5, 6), generator=torch.Generator().manual_seed(0))

    def last_logits(m, batch):
        return {"logits": m(batch)[:, -1], "argmax": m(batch)[:, -1].argmax(-1)}

    labels = [f"prompt {i}" for i in range(5)]
    out = tmp_path / "s.safetensors"
    result = sweep(model, last_logits, list(prompts), batch_size=2, labels=labels, out=out)
    loop = torch.cat([model(p[None])[:, -1] for p in prompts])
    torch.testing.assert_close(result.values["logits"], loop, rtol=0, atol=1e-12)
    assert result.values["argmax"].tolist() == loop.argmax(-1).tolist()
    assert result.labels == tuple(labels) and result.items.tolist() == list(range(5))
    saved = load_sweep(out)
    assert saved.labels == result.labels and torch.equal(
        saved.values["logits"], result.values["logits"]
    )


def test_sweep_refuses_a_function_whose_first_axis_is_not_the_batch():
    model = byte_model()
    prompts = list(torch.randint(0, 256, (4, 6)))
    with pytest.raises(ValueError, match=r"first axis must be the batch \(2 items\)"):
        sweep(model, lambda m, batch: m(batch)[0], prompts, batch_size=2)
