"""Packing inputs into contexts: deterministic, recorded, the model's start token first."""

import pytest
import torch

from hookedattn import ByteTokenizer, HookedTransformer
from hookedattn.store import default_corpus, pack
from hookedattn.testing import tiny_model

BOS = ByteTokenizer().bos_token_id


def byte_model(n_ctx: int = 8) -> HookedTransformer:
    fields = dict(n_layers=1, d_model=8, n_heads=2, n_ctx=n_ctx, d_vocab=259, attn_only=True)
    return tiny_model(tokenizer=ByteTokenizer(), dtype=torch.float32, **fields)


def test_texts_are_joined_and_cut_into_contexts_after_the_start_token():
    packed = pack(byte_model(), ["abcdefg", "hijklmnopq"], context=4)
    stream = list(b"abcdefghijklmnopq")
    expected = [[BOS, *stream[i : i + 3]] for i in range(0, 15, 3)]
    assert packed.contexts(0, len(packed)).tolist() == expected
    assert packed.packing.n_contexts == 5 and packed.packing.bos == BOS


def test_a_separator_goes_between_documents_only():
    packed = pack(byte_model(), ["ab", "cd"], context=3, separator=257)
    assert packed.contexts(0, 2).tolist() == [[BOS, 97, 98], [BOS, 257, 99]]


def test_packing_is_deterministic_and_its_digest_depends_on_the_tokens():
    model = byte_model()
    first = pack(model, ["some text here"], context=4).packing
    assert first == pack(model, ["some text here"], context=4).packing
    assert first.sha256 != pack(model, ["some text HERE"], context=4).packing.sha256


def test_token_tensors_dict_rows_and_files_are_documents(tmp_path):
    model = byte_model()
    path = tmp_path / "doc.txt"
    path.write_text("abcdef")
    from_file = pack(model, [path], context=4).contexts(0, 2)
    from_row = pack(model, [{"text": "abcdef"}], context=4).contexts(0, 2)
    from_ids = pack(model, [torch.tensor(list(b"abcdef"))], context=4).contexts(0, 2)
    assert from_file.tolist() == from_row.tolist() == from_ids.tolist()


def test_a_2d_token_tensor_is_taken_as_ready_contexts():
    tokens = torch.randint(0, 256, (5, 8))
    packed = pack(byte_model(), tokens)
    assert torch.equal(packed.contexts(1, 3), tokens[1:3])
    with pytest.raises(ValueError, match=r"packed contexts \[batch pos=8\]"):
        pack(byte_model(), torch.randint(0, 256, (5, 6)))


def test_n_tokens_rounds_up_to_whole_contexts_and_reads_an_iterable_only_so_far():
    def documents():
        yield "x" * 30
        raise AssertionError("read past the tokens asked for")

    packed = pack(byte_model(), documents(), context=8, n_tokens=20)
    assert len(packed) == 3 and packed.n_tokens == 24


def test_too_few_tokens_is_an_error_that_gives_the_counts():
    with pytest.raises(ValueError, match=r"hold 10 tokens, 1 contexts of 8; 2 contexts"):
        pack(byte_model(), ["0123456789"], context=8, n_tokens=16)


def test_the_default_corpus_is_the_stdlib_training_split():
    packed = pack(byte_model(), None, context=8, n_tokens=80)
    stream = default_corpus()[:70]
    assert packed.contexts(0, 10)[:, 1:].reshape(-1).tolist() == stream.tolist()
    assert packed.packing.source == "stdlib-train"


def test_context_beyond_the_model_is_refused():
    with pytest.raises(ValueError, match=r"context must be an int in 2..8"):
        pack(byte_model(), ["abc"], context=9)
