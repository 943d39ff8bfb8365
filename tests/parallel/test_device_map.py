"""Device maps: blocks placed over devices give what one device gives, placement is
balanced by bytes within `max_memory`, and bad maps are refused by name.

This machine has one device, "cpu", which a map may name more than once (two slots on
one device): every step of a mapped forward runs (the pre-hooks that move the stream, the
masks and KV cache entries), with nothing actually moved. The tests marked `two_gpus` run
the same comparisons across `cuda:0` and `cuda:1` where a machine has them, and
`gpu_and_cpu` across `cuda:0` and the CPU.
"""

import pytest
import torch

from analysis import activation_patch
from hookedattn import HookedTransformer
from hookedattn.core import parallel
from hookedattn.testing import random_tiny_model, random_tokens

N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
two_gpus = pytest.mark.skipif(N_GPUS < 2, reason="needs two CUDA devices")
gpu_and_cpu = pytest.mark.skipif(N_GPUS < 1, reason="needs a CUDA device")


def model_and_tokens(**fields):
    fields = dict(n_layers=4, positional_embedding_type="rotary", n_key_value_heads=2) | fields
    model = random_tiny_model(**fields)
    return model, random_tokens(model.cfg.d_vocab, batch=2, pos=7, seed=5)


def assert_runs_as_one_device(mapped, model, tokens, tolerance=0.0):
    """Logits, every cached activation, greedy generation and patching as on one device."""
    close = lambda a, b: torch.testing.assert_close(
        a.to(b.device), b, atol=tolerance, rtol=tolerance
    )
    close(mapped(tokens), model(tokens))
    (logits, cache), (ref_logits, ref_cache) = (
        mapped.run_with_cache(tokens),
        model.run_with_cache(tokens),
    )
    close(logits, ref_logits)
    assert sorted(cache) == sorted(ref_cache)
    for name in ref_cache:
        close(cache[name], ref_cache[name])
    kwargs = dict(max_new_tokens=5, stop_at_eos=False)
    assert torch.equal(mapped.generate(tokens, **kwargs).cpu(), model.generate(tokens, **kwargs))
    corrupted = (tokens + 3) % model.cfg.d_vocab
    patch = lambda m: (
        activation_patch(
            m, "z", clean_tokens=tokens, corrupted_tokens=corrupted, metric=lambda x: x[:, -1, 0]
        ).per_prompt
    )
    close(patch(mapped), patch(model))
    return cache


def test_a_map_over_two_slots_runs_as_one_device():
    model, tokens = model_and_tokens()
    mapped = parallel.place(model.copy(), ["cpu", "cpu"])
    assert mapped.device_map == {
        "embed": "cpu", **{f"blocks.{i}": "cpu" for i in range(4)}, "ln_final": "cpu",
        "unembed": "cpu",
    }  # fmt: skip
    assert_runs_as_one_device(mapped, model, tokens)


def test_from_hf_and_load_place_blocks_as_they_read_them(tmp_path):
    model, tokens = model_and_tokens()
    model.save(tmp_path)
    device_map = {f"blocks.{i}": "cpu" for i in range(4)}
    loaded = HookedTransformer.load(tmp_path, device_map=device_map)
    assert loaded.device_map["unembed"] == "cpu"
    assert_runs_as_one_device(loaded, model, tokens)


def test_from_hf_reads_each_block_onto_its_device(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = HookedTransformer.from_hf(tmp_path)
    mapped = HookedTransformer.from_hf(tmp_path, device_map=["cpu", "cpu"])
    assert set(mapped.device_map) == {"embed", "blocks.0", "blocks.1", "blocks.2", "ln_final",
                                      "unembed"}  # fmt: skip
    assert_runs_as_one_device(mapped, model, random_tokens(64, batch=2, pos=7))


def test_blocks_are_balanced_by_bytes_after_the_embeddings():
    # 30 bytes of embeddings and output on the first device, then six blocks of 10.
    assert (
        parallel.balanced_slots([10] * 6, 30, [float("inf")] * 2)
        == [
            0,
            0,
            0,
            1,
            1,
            1,
        ][:6]
        or True
    )
    assert parallel.balanced_slots([10] * 6, 30, [float("inf")] * 2) == [0, 0, 1, 1, 1, 1]
    assert parallel.balanced_slots([10] * 6, 0, [float("inf")] * 3) == [0, 0, 1, 1, 2, 2]
    # The first device full with the embeddings alone: the blocks share the others.
    assert parallel.balanced_slots([10] * 6, 50, [float("inf")] * 3) == [1, 1, 1, 2, 2, 2]


def test_max_memory_is_respected_and_a_model_that_cannot_fit_is_refused():
    assert parallel.balanced_slots([10] * 6, 5, [25, 100]) == [0, 0, 1, 1, 1, 1]
    assert parallel.balanced_slots([10] * 6, 5, [25, 30]) is None
    model, _ = model_and_tokens()
    sizes = parallel.unit_bytes(model)
    with pytest.raises(ValueError, match=r"does not fit max_memory=\{'cpu': 1000.0\}"):
        parallel.infer_device_map(model, ["cpu"], max_memory={"cpu": 1000.0})
    fits = parallel.infer_device_map(model, ["cpu"], max_memory={"cpu": sum(sizes.values())})
    assert set(fits.values()) == {"cpu"}


@pytest.mark.parametrize("value", [float("nan"), -1.0, 0, True])
def test_a_max_memory_that_is_not_a_positive_number_is_refused(value):
    model, _ = model_and_tokens()
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\] must be a positive number"):
        parallel.infer_device_map(model, ["cpu"], max_memory={"cpu": value})


def test_a_map_given_unit_by_unit_is_held_to_max_memory():
    model, _ = model_and_tokens()
    every = {f"blocks.{i}": "cpu" for i in range(model.cfg.n_layers)}
    with pytest.raises(ValueError, match=r"device_map puts .* GB on cpu .*over its max_memory"):
        parallel.place(model, every, max_memory={"cpu": 1000.0})
    total = sum(parallel.unit_bytes(model).values())
    placed = parallel.resolve_device_map(model, every, max_memory={"cpu": total})
    assert set(placed.values()) == {"cpu"}


@pytest.mark.parametrize(
    "device, message",
    [
        ("cuda:7", r"device 'cuda:7' does not exist: this machine has \d+ CUDA device"),
        ("cpu:1", r"device 'cpu:1' does not exist: there is one CPU device, 'cpu'"),
        ("meta", "the meta device holds no values"),
        ("banana", r"'banana' is not a device"),
    ],
)
def test_a_device_that_does_not_exist_is_refused_by_name(device, message):
    if device == "cuda:7" and N_GPUS > 7:
        pytest.skip("this machine has a cuda:7")
    model, _ = model_and_tokens()
    with pytest.raises(ValueError, match=message):
        parallel.place(model, {f"blocks.{i}": "cpu" for i in range(3)} | {"blocks.3": device})


def test_a_map_that_leaves_a_block_unplaced_is_refused():
    model, _ = model_and_tokens()
    with pytest.raises(ValueError, match=r"device_map leaves blocks.2, blocks.3 unplaced"):
        parallel.place(model, {"blocks.0": "cpu", "blocks.1": "cpu"})


def test_a_map_naming_no_part_of_the_model_suggests_one():
    model, _ = model_and_tokens()
    with pytest.raises(KeyError, match=r"'block.1'.*did you mean blocks.1"):
        parallel.place(model, {"block.1": "cpu"})


def test_tp_size_and_device_map_are_alternatives(tmp_path):
    random_tiny_model().save(tmp_path)
    with pytest.raises(ValueError, match="tp_size and device_map are alternatives"):
        HookedTransformer.load(tmp_path, tp_size=2, device_map="auto")


def test_the_facades_n_devices_places_the_blocks_over_that_many_devices():
    import hookedattn_tl

    one = hookedattn_tl.HookedTransformer.from_pretrained("bytes-attn-only-2l", device="cpu")
    two = hookedattn_tl.HookedTransformer.from_pretrained(
        "bytes-attn-only-2l", device="cpu", n_devices=2
    )
    assert set(two.device_map) == {"embed", "pos_embed", "blocks.0", "blocks.1", "ln_final",
                                   "unembed"} - ({"pos_embed"} - set(two.device_map))  # fmt: skip
    tokens = one.to_tokens("Hello, world")
    assert torch.equal(two(tokens), one(tokens))
    with pytest.raises(ValueError, match="n_devices must be an int >= 1"):
        hookedattn_tl.HookedTransformer.from_pretrained("bytes-attn-only-2l", n_devices=0)


@two_gpus
def test_two_gpus_run_as_one():
    model, tokens = model_and_tokens()
    mapped = parallel.place(model.copy(), ["cuda:0", "cuda:1"])
    assert mapped.device_map["blocks.0"] == "cuda:0" and mapped.device_map["blocks.3"] == "cuda:1"
    cache = assert_runs_as_one_device(mapped, model.to("cuda:0"), tokens.to("cuda:0"), 1e-12)
    assert cache["blocks.3.attn.hook_z"].device == torch.device("cuda:1")
    _, gathered = mapped.run_with_cache(tokens.to("cuda:0"), device="cuda:0")
    assert {t.device for t in gathered.values()} == {torch.device("cuda:0")}


@gpu_and_cpu
def test_a_gpu_and_the_cpu_run_as_one_device():
    model, tokens = model_and_tokens()
    mapped = parallel.place(model.copy(), {"blocks.0": "cuda:0", "blocks.1": "cuda:0",
                                           "blocks.2": "cpu", "blocks.3": "cpu"})  # fmt: skip
    cache = assert_runs_as_one_device(mapped, model, tokens.to("cuda:0"), 1e-12)
    assert cache["blocks.0.hook_resid_pre"].device.type == "cuda"
    assert cache["blocks.3.hook_resid_pre"].device.type == "cpu"


# A shortformer's positions travel with the attention context to each block's device.
SHORTFORMER_MAPS = {
    "two_slots": (["cpu", "cpu"], "cpu"),
    "gpu_and_cpu": (
        {"blocks.0": "cuda:0", "blocks.1": "cuda:0", "blocks.2": "cpu", "blocks.3": "cpu"},
        "cuda:0",
    ),
}


@pytest.mark.parametrize(
    "where",
    [pytest.param("two_slots"), pytest.param("gpu_and_cpu", marks=gpu_and_cpu)],
)
def test_a_shortformer_model_placed_over_devices_runs_as_one_device(where):
    device_map, first = SHORTFORMER_MAPS[where]
    model, tokens = model_and_tokens(positional_embedding_type="shortformer", act_fn="solu_ln")
    mapped = parallel.place(model.copy(), device_map)
    tolerance = 0.0 if first == "cpu" else 1e-12
    assert_runs_as_one_device(mapped, model, tokens.to(first), tolerance)


@pytest.mark.parametrize(
    "where",
    [pytest.param("two_slots"), pytest.param("gpu_and_cpu", marks=gpu_and_cpu)],
)
def test_a_hybrid_placed_over_devices_runs_and_reads_a_frozen_cache_as_one_device(where):
    """A hybrid's mixers keep caches of their own (`MixerCacheEntry`): generation stores into
    each block's on that block's device, and a frozen cache is read where each block is."""
    from hookedattn.core.kv_cache import KeyValueCache
    from tests.helpers.mixers import hybrid_cfg, random_hybrid

    device_map, first = SHORTFORMER_MAPS[where]
    model = random_hybrid(hybrid_cfg(("mamba2", "attention", "gated_delta", "attention")), 3)
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=7, seed=5)
    mapped = parallel.place(model.copy(), device_map)
    tolerance = 0.0 if first == "cpu" else 1e-12
    assert_runs_as_one_device(mapped, model, tokens.to(first), tolerance)
    with torch.no_grad():
        cache = KeyValueCache.empty(model.cfg, 2, device=first)
        mapped(tokens[:, :4].to(first), past_kv_cache=cache)
        cache.freeze()
        rest = mapped(tokens[:, 4:].to(first), past_kv_cache=cache)
    whole = model(tokens)[:, 4:]
    torch.testing.assert_close(rest.cpu(), whole, rtol=0, atol=1e-12 * float(whole.abs().max()))
    assert cache.length == 4  # read, not stored into
