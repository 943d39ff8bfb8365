"""Memory-mapped loading: a checkpoint is read a chunk at a time into a model built on the
meta device, and a rank of a tensor-parallel job reads only its slices.

Fast checks, in one process: for four HF families (GPT-2's fused `c_attn`, GPT-NeoX's
interleaved q/k/v, Llama's grouped keys and values, Phi-3's unequal fused parts), every
tensor read in chunks of a few bytes equals the whole-tensor conversion (`_table.convert`,
the importer's earlier path), every rank's slice equals the slice of the whole tensor, and
reading a slice reads its bytes and no more. Our own checkpoints load in chunks too.

The measurements (`HOOKEDATTN_MEMORY_TEST=1`, as tests/hf/test_hf_memory.py) write a ~100M
parameter bfloat16 Llama and load it in fresh processes, reporting the growth of the
resident set's high-water mark over the model's bytes.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.core import _weights_io
from hookedattn.core.hf import _importer, _loading, _slices
from hookedattn.core.hf._table import axis_sizes, convert
from hookedattn.core.parallel._sublayers import shard_plan
from hookedattn.testing import random_tiny_model, random_tokens

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]

SMALL = dict(vocab_size=64, max_position_embeddings=32, num_hidden_layers=2)
FAMILIES = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(
        n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=65)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        **SMALL, hidden_size=32, intermediate_size=64, num_attention_heads=4, rotary_pct=0.5)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(
        **SMALL, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(
        **SMALL, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0)),
}  # fmt: skip


def save_hf(family: str, path: Path, dtype: torch.dtype = torch.float32) -> Path:
    architecture, config_class, fields = FAMILIES[family]
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(getattr(transformers, config_class)(**fields))
    with torch.no_grad():
        for param in hf.parameters():  # biases and gains away from 0 and 1
            param.add_(0.1 * torch.randn_like(param))
    hf.to(dtype).save_pretrained(path)
    return path


def whole_conversion(path: Path) -> dict[str, torch.Tensor]:
    """The importer's earlier path: each HF tensor read whole and converted."""
    hf_config = _loading.read_config(path)
    candidates = _importer.families_of_config(hf_config)  # by convention: the twin chooses
    family, _ = _importer._verified_of(HookedTransformer, str(path), candidates, hf_config, True)
    source = _loading.SafetensorsFiles(_loading.safetensors_files(path))
    cfg = family.config(hf_config, source.stored_dtype(), "cpu")
    table = family.table(hf_config, cfg, None)
    return dict(convert(table, source, cfg, cfg.dtype, "cpu")), (table, source, cfg)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def hf_dir(request, tmp_path_factory):
    dtype = torch.bfloat16 if request.param == "llama" else torch.float32
    return save_hf(request.param, tmp_path_factory.mktemp(request.param), dtype)


def test_a_directory_read_in_tiny_chunks_equals_every_tensor_read_whole(hf_dir, monkeypatch):
    expected, _ = whole_conversion(hf_dir)
    monkeypatch.setattr(_slices, "CHUNK_BYTES", 64)  # every matrix in many chunks
    model = HookedTransformer.from_hf(hf_dir)
    state = model.state_dict()
    assert sorted(state) == sorted(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name


def test_every_ranks_slice_is_that_slice_of_the_whole_tensor(hf_dir):
    expected, (table, source, cfg) = whole_conversion(hf_dir)
    rules = {rule.ours: rule for rule in table.rules}
    stored, sizes = table.source_names(source.shapes), axis_sizes(cfg)
    for n_ranks in (2, 4):
        for rank in range(n_ranks):
            plan = shard_plan(list(expected), cfg, rank, n_ranks)
            assert any(name.endswith("attn.W_Q") for name in plan)
            for name, part in plan.items():
                rule = rules[name]
                ranges = _slices._our_range(rule, part.axis, part, sizes)
                got = _slices.read_rule(
                    rule, source, stored.get(rule.hf), sizes, ranges, cfg.dtype, "cpu"
                )
                want = expected[name].narrow(part.axis, part.start, part.length)
                assert torch.equal(got, want), (name, rank, n_ranks)


def test_runs_read_as_their_span_equal_the_runs_read_one_by_one(hf_dir, monkeypatch):
    # MAX_RUNS=0: every dimension is read as the span of its runs, the runs then taken in
    # memory (the path of an interleaved part picked out of every row).
    monkeypatch.setattr(_slices, "MAX_RUNS", 0)
    test_every_ranks_slice_is_that_slice_of_the_whole_tensor(hf_dir)
    monkeypatch.setattr(_slices, "CHUNK_BYTES", 64)
    test_a_directory_read_in_tiny_chunks_equals_every_tensor_read_whole(hf_dir, monkeypatch)


def test_reading_a_slice_reads_its_bytes_and_no_more(tmp_path, monkeypatch):
    path = save_hf("llama", tmp_path)
    expected, (table, source, cfg) = whole_conversion(path)
    read_bytes = []
    original = _loading.SafetensorsFiles.read_regions

    def counting(self, name, regions):
        parts = original(self, name, regions)
        read_bytes.append(sum(p.numel() * p.element_size() for p in parts))
        return parts

    monkeypatch.setattr(_loading.SafetensorsFiles, "read_regions", counting)
    read = _slices.table_reader(table, source, cfg)
    stored = {rule.ours for rule in table.rules if rule.hf is not None}  # not the zero biases
    plan = shard_plan(list(expected), cfg, 1, 2)
    assert len(set(plan) & stored) >= 2 + 5 * cfg.n_layers  # (un)embedding, q k v o, MLP
    for name, part in plan.items():
        if name not in stored:
            continue
        read_bytes.clear()
        tensor = read(name, part, "cpu")
        assert sum(read_bytes) == tensor.numel() * tensor.element_size(), name


def test_our_checkpoints_load_in_chunks(tmp_path, monkeypatch):
    model = random_tiny_model(d_vocab=33)
    model.save(tmp_path)
    monkeypatch.setattr(_weights_io, "CHUNK_BYTES", 40)
    loaded = HookedTransformer.load(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    tokens = random_tokens(33, batch=1, pos=5)
    assert torch.equal(loaded(tokens), model(tokens))


def test_a_float32_checkpoint_loads_as_bfloat16_chunk_by_chunk(tmp_path, monkeypatch):
    model = random_tiny_model(dtype=torch.float32)
    model.save(tmp_path)
    monkeypatch.setattr(_weights_io, "CHUNK_BYTES", 40)
    loaded = HookedTransformer.load(tmp_path, dtype=torch.bfloat16)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16)), name


# ------------------------------------------------------------------ measured
SHAPE = dict(
    vocab_size=16000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
    num_attention_heads=16, num_key_value_heads=4,
)  # fmt: skip

MEASURE = """
import json, os, pathlib, resource, sys, torch, transformers
torch.set_num_threads(1)
from hookedattn import HookedTransformer
from hookedattn.testing import tiny_model

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def high_water_mark():
    # This process's own peak (VmHWM). Not ru_maxrss: Linux carries the parent's peak
    # over into it at exec (the forked copy's), so a child of a large pytest process
    # would report the parent's size.
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

mode, path = sys.argv[1], sys.argv[2]
if mode != "load":
    transformers.AutoConfig.from_pretrained(path)  # the config's code, loaded once
tiny_model()  # the first model any process builds pays one-time costs of torch's code
os.sync()
for f in pathlib.Path(path).glob("*.safetensors"):  # start with the file out of the page cache
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
before = resident()
if mode == "transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
elif mode == "load":
    model = HookedTransformer.load(path)
else:  # unverified: the check on a tiny twin (from_hf's verify) is no part of the load
    model = HookedTransformer.from_hf(path, tp_size=2 if mode == "tp" else None, verify=False)
peak = high_water_mark()
size = sum(t.nbytes for t in model.state_dict().values())
rank = int(os.environ.get("RANK", "0"))
report = dict(mode=mode, rank=rank, before=before, peak=peak, size=size)
pathlib.Path(sys.argv[3]).joinpath(f"{mode}-{rank}.json").write_text(json.dumps(report))
"""


def save_random_llama(path: Path) -> int:
    """A ~100M-parameter bfloat16 Llama (random weights), written by `save_pretrained`."""
    config = transformers.LlamaConfig(**SHAPE, max_position_embeddings=256)
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(config)
    hf = hf.to_empty(device="cpu").to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    hf.save_pretrained(path)
    return sum(p.numel() for p in hf.parameters())


def measure(mode: str, path: Path, out: Path) -> list[dict]:
    script = out / "measure.py"
    script.write_text(MEASURE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), mode, str(path), str(out)]
    if mode == "tp":
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{mode}-*.json"))]


@pytest.fixture(scope="module")
def big_llama(tmp_path_factory):
    if os.environ.get("HOOKEDATTN_MEMORY_TEST") != "1":
        pytest.skip(
            "a measurement, run on its own: HOOKEDATTN_MEMORY_TEST=1 pytest "
            "tests/parallel/test_mmap_loading.py (writes a 200 MB checkpoint)"
        )
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/statm")
    path = tmp_path_factory.mktemp("llama100m")
    n_params = save_random_llama(path)
    assert 95e6 < n_params < 105e6
    yield path
    for file in path.iterdir():  # 200 MB: do not leave it behind
        file.unlink()


def growth(report: dict, size: float) -> float:
    return (report["peak"] - report["before"]) / size


def test_one_process_loading_peaks_within_5_percent_of_the_model(big_llama, tmp_path):
    (report,) = measure("hf", big_llama, tmp_path)
    assert 195e6 < report["size"] < 205e6  # bfloat16 kept: no float32 copy
    assert growth(report, report["size"]) <= 1.05, report


def test_our_checkpoint_loads_within_5_percent_of_the_model(big_llama, tmp_path):
    HookedTransformer.from_hf(big_llama).save(tmp_path / "ours")
    (report,) = measure("load", tmp_path / "ours", tmp_path)
    assert growth(report, report["size"]) <= 1.05, report


def test_each_rank_peaks_near_its_share_of_the_model(big_llama, tmp_path):
    reports = measure("tp", big_llama, tmp_path)
    whole = (
        2 * (SHAPE["vocab_size"] * SHAPE["hidden_size"]) * 2
        + 6 * (2 * 1024 * 1024 + 2 * 1024 * 256 + 3 * 1024 * 2816) * 2
    )  # bytes: bfloat16 embeddings and blocks (norm gains aside)
    embedding = SHAPE["vocab_size"] * SHAPE["hidden_size"] * 2
    assert len(reports) == 2
    for report in reports:
        assert report["size"] <= 0.55 * whole, report
        assert report["peak"] - report["before"] <= 1.1 * whole / 2 + embedding, report
    assert math.isclose(sum(r["size"] for r in reports), whole, rel_tol=0.01)
