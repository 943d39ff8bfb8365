"""`from_hf` on directories, dtypes and bad input: sharded and bfloat16 checkpoints load, a
bfloat16 checkpoint loaded as bfloat16 never passes through float32, and what cannot be
imported (a family, a rotary scaling, a checkpoint that does not match its config) is
refused by name. Each family's directory against its live model is in test_hf_families."""

import json

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.twins import streams_worst, tiny_twin
from helpers.wide_tensors import LargeFloat32Tensors
from safetensors.torch import load_file, save_file

from hookedattn import CheckpointError, HookedTransformer
from hookedattn.core.hf import SUPPORTED_ARCHITECTURES

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29]])


def make_llama(**overrides):
    config = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager", initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config | overrides)).eval()


@pytest.fixture(scope="module")
def llama():
    return make_llama()


@pytest.fixture(scope="module")
def llama_dir(llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    llama.save_pretrained(path)
    return path


def test_a_sharded_directory_loads_like_one_file(llama, llama_dir, tmp_path):
    llama.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    sharded, whole = HookedTransformer.from_hf(tmp_path), HookedTransformer.from_hf(llama_dir)
    for name, tensor in whole.state_dict().items():
        assert torch.equal(sharded.state_dict()[name], tensor), name


# A fresh model for each bfloat16 save: `to(bfloat16)` also rounds HF's rotary frequency
# buffer, which a shared model would keep after going back to float32.
def test_a_directory_loads_in_its_stored_dtype_unless_told(tmp_path):
    make_llama().to(torch.bfloat16).save_pretrained(tmp_path)
    assert HookedTransformer.from_hf(tmp_path).cfg.dtype == torch.bfloat16
    as_float32 = HookedTransformer.from_hf(tmp_path, dtype=torch.float32)
    assert as_float32.cfg.dtype == torch.float32
    assert as_float32.W_Q.dtype == torch.float32


def test_bfloat16_to_bfloat16_never_makes_a_float32_copy(tmp_path):
    make_llama().to(torch.bfloat16).save_pretrained(tmp_path)
    # The smallest weight matrix: no float32 tensor that large may appear while loading.
    smallest = 32 * 16  # d_model x (kv_head d_head)
    # Verified first (and remembered): the tiny twin of the check computes in float32 by
    # design, from random weights of its own; the recorded load reads the memo.
    HookedTransformer.from_hf(tmp_path, dtype=torch.bfloat16)
    with LargeFloat32Tensors(smallest) as recorder:
        model = HookedTransformer.from_hf(tmp_path, dtype=torch.bfloat16)
    assert recorder.seen == []
    stored = load_file(str(tmp_path / "model.safetensors"))
    W_K = stored["model.layers.1.self_attn.k_proj.weight"]  # [(kv_head d_head) d_model]
    assert torch.equal(model.blocks[1].attn._W_K[1, :, 3], W_K[8 + 3])


def test_a_directory_without_safetensors_is_refused(llama, tmp_path):
    llama.config.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"no weights in .*reads \*\.safetensors"):
        HookedTransformer.from_hf(tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(llama, tmp_path, name):
    # Opening a FIFO for reading blocks until a writer comes: nothing may open one.
    import os

    llama.config.save_pretrained(tmp_path)
    if name != "model.safetensors":
        save_file({k: v.contiguous() for k, v in llama.state_dict().items()},
                  tmp_path / "model.safetensors")  # fmt: skip
    os.mkfifo(tmp_path / name)
    with pytest.raises(CheckpointError, match=f"{name} is not a regular file"):
        HookedTransformer.from_hf(tmp_path)


def test_a_checkpoint_that_does_not_match_its_config_is_listed(llama_dir, tmp_path):
    tensors = load_file(str(llama_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.rotary.weight"] = torch.zeros(3)
    tensors["model.norm.weight"] = torch.zeros(5)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    with pytest.raises(CheckpointError) as error:
        HookedTransformer.from_hf(tmp_path)
    message = str(error.value)
    assert "the LlamaForCausalLM (by convention) state dict does not match its config" in message
    assert "missing ['model.layers.1.mlp.up_proj.weight']" in message
    assert "unexpected ['model.layers.0.self_attn.rotary.weight']" in message
    assert "model.norm.weight: (5,) instead of (32,)" in message


def test_an_untied_model_needs_its_unembedding(llama_dir, tmp_path):
    tensors = load_file(str(llama_dir / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"missing \['lm_head.weight'\]"):
        HookedTransformer.from_hf(tmp_path)


def test_a_base_model_without_its_head_says_what_to_pass(llama):
    with pytest.raises(ValueError, match="for llama, pass the LlamaForCausalLM"):
        HookedTransformer.from_hf(llama.model)


def test_an_unsupported_family_lists_the_supported_ones():
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32,
        )
    )  # fmt: skip
    with pytest.raises(ValueError) as error:
        HookedTransformer.from_hf(bert)
    assert "cannot import BertModel (model_type='bert')" in str(error.value)
    assert ", ".join(SUPPORTED_ARCHITECTURES) in str(error.value)
    assert len(SUPPORTED_ARCHITECTURES) == 16


def test_a_rotary_scaling_we_cannot_express_is_named():
    rope = dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)
    with pytest.raises(ValueError, match="rope_type 'dynamic'.*supported: default, linear, llama3"):
        HookedTransformer.from_hf(make_llama(num_hidden_layers=1, rope_parameters=rope))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=2.0)),
        dict(mlp_bias=True),  # refused while Llama was written out; the convention reads it
    ],
    ids=["yarn", "mlp_bias"],
)
def test_llama_variants_the_convention_reads_import_exactly(overrides):
    llama = make_llama(num_hidden_layers=1, **overrides).double()
    model = HookedTransformer.from_hf(llama)
    assert model.verification is not None
    with torch.no_grad():
        expected = InFloat64Throughout(llama)(TOKENS).logits
        assert float((model(TOKENS) - expected).abs().max()) <= 1e-10 * float(expected.abs().max())


def test_a_subclass_of_a_supported_class_imports_as_its_family(llama):
    class MyLlama(transformers.LlamaForCausalLM):
        pass

    mine = MyLlama(llama.config).eval()
    mine.load_state_dict(llama.state_dict())
    with torch.no_grad():
        expected = llama(TOKENS).logits
    ours = HookedTransformer.from_hf(mine)(TOKENS).detach()
    assert float((ours - expected).abs().max()) <= 1e-5


def test_a_folder_that_keeps_its_layers_under_another_name_loads(tmp_path, monkeypatch):
    # EXAONE 3 is a Llama whose files keep its layers as `transformer.h.{i}.` (transformers
    # renames them on load, back on save); each layer's tensors are read from its own index.
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))
    reference = tiny_twin("exaone", seed=1).double()
    reference.save_pretrained(tmp_path / "exaone")
    saved = load_file(tmp_path / "exaone" / "model.safetensors")
    assert {"transformer.h.0.ln_1.weight", "transformer.h.1.ln_1.weight"} <= set(saved)
    model = HookedTransformer.from_hf(tmp_path / "exaone", dtype=torch.float64)
    assert streams_worst(model, InFloat64Throughout(reference), TOKENS) <= 1e-12
