"""Tokenizers and the model's text methods: to_tokens, to_str_tokens, to_string, ..."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookedattn import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
)
from hookedattn.core.tokenizers import as_tokenizer
from hookedattn.testing import tiny_model

tokenizers_lib = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")


def make_model(tokenizer=None, d_vocab=259):
    fields = dict(n_layers=1, n_heads=2, n_ctx=64, d_mlp=32)
    return tiny_model(tokenizer=tokenizer, d_vocab=d_vocab, **fields)


@pytest.fixture(scope="module")
def model():
    return make_model(ByteTokenizer())


def trained_bpe():
    """A byte-level BPE trained here on a few sentences (GPT-2's scheme, no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["the cat sat on the mat", "the dog sat on the log", "hello world, héllo wörld"]
    tok.train_from_iterator(corpus * 20, trainer=trainer)
    return tok


# ---------------------------------------------------------------- byte tokenizer
@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_any_string(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_never_encodes_text_as_special_tokens():
    tok = ByteTokenizer()
    ids = tok.encode("<bos>x<eos>")
    assert max(ids) < 256
    assert tok.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == "<bos><bos>x<eos><eos>"
    assert tok.decode([tok.bos_token_id, *ids, tok.pad_token_id], skip_special_tokens=True) == (
        "<bos>x<eos>"
    )


def test_byte_tokenizer_str_tokens_escape_partial_characters():
    tok = ByteTokenizer()
    assert [tok.str_token(i) for i in tok.encode("aé")] == ["a", "\\xc3", "\\xa9"]
    assert tok.str_token(256) == "<bos>"


def test_byte_tokenizer_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match="token id 259 is out of range"):
        ByteTokenizer().decode([1, 259])


def test_a_lone_surrogate_is_refused_naming_its_position():
    with pytest.raises(ValueError, match=r"'\\ud800' at position 2 .* lone surrogate"):
        ByteTokenizer().encode("ab\ud800c")
    assert ByteTokenizer().decode(ByteTokenizer().encode("ab\U0001f600c")) == "ab\U0001f600c"


# ---------------------------------------------------------------- char tokenizer
def test_char_tokenizer_ids_follow_the_alphabet_then_specials():
    tok = CharTokenizer("ab ")
    assert tok.encode("ba a") == [1, 0, 2, 0]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.vocab_size) == (3, 4, 5, 6)
    assert tok.decode([3, 1, 0, 4]) == "<bos>ba<eos>"
    assert tok.decode([3, 1, 0, 4], skip_special_tokens=True) == "ba"


@given(st.text(alphabet="xyz.", max_size=30))
def test_char_tokenizer_round_trips_strings_of_its_alphabet(text):
    tok = CharTokenizer("xyz.")
    assert tok.decode(tok.encode(text)) == text


def test_char_tokenizer_without_specials():
    tok = CharTokenizer("01", bos_token=None, eos_token=None, pad_token=None)
    assert tok.vocab_size == 2
    assert tok.bos_token_id is None
    assert tok.padding_id() == 0


def test_char_tokenizer_names_a_character_outside_its_alphabet():
    with pytest.raises(ValueError, match=r"'c' at position 2 .* not in the alphabet 'ab'"):
        CharTokenizer("ab").encode("abc")


@pytest.mark.parametrize(
    ("alphabet", "message"),
    [("", "must not be empty"), ("aba", "more than once"), (["ab"], "single")],
)
def test_char_tokenizer_rejects_bad_alphabets(alphabet, message):
    with pytest.raises(ValueError, match=message):
        CharTokenizer(alphabet)


def test_a_char_tokenizer_special_token_in_its_alphabet_is_refused():
    with pytest.raises(ValueError, match=r"special tokens \['#'\] are also characters"):
        CharTokenizer("ab#", bos_token="#")
    CharTokenizer("ab#", bos_token="<bos>")  # names outside the alphabet are fine


# ---------------------------------------------------------------- HF adapter
def test_hf_adapter_of_a_bare_tokenizers_object_matches_it():
    bpe = trained_bpe()
    tok = HFTokenizer(bpe, bos_token="<|endoftext|>", pad_token="<pad>")
    text = "the cat sat, héllo"
    assert tok.encode(text) == bpe.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text)) == text
    assert tok.bos_token_id == bpe.token_to_id("<|endoftext|>")
    assert tok.eos_token_id is None
    assert tok.vocab_size == bpe.get_vocab_size(with_added_tokens=True)


def test_hf_adapter_of_a_transformers_tokenizer_reads_its_special_tokens():
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=trained_bpe(), bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    tok = as_tokenizer(fast)
    assert isinstance(tok, HFTokenizer)
    assert tok.bos_token_id == tok.eos_token_id == fast.bos_token_id
    assert tok.pad_token_id is None
    assert tok.padding_id() == fast.eos_token_id  # GPT-2 pads with EOS, as TransformerLens
    assert tok.encode("the dog") == fast.encode("the dog", add_special_tokens=False)
    # One token alone reads as text, not as the byte-level alphabet ("Ġdog").
    assert [tok.str_token(i) for i in tok.encode("the dog")][-1].endswith("dog")
    assert "".join(tok.str_token(i) for i in tok.encode("the dog")) == "the dog"


def test_hf_adapter_rejects_an_unknown_special_token():
    with pytest.raises(ValueError, match="'<nope>' is not in the tokenizer's vocabulary"):
        HFTokenizer(trained_bpe(), bos_token="<nope>")


def test_as_tokenizer_rejects_other_objects():
    with pytest.raises(TypeError, match="cannot use a dict as a tokenizer"):
        as_tokenizer({})


def test_model_with_hf_tokenizer_prepends_its_bos():
    bpe = trained_bpe()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>")
    model = make_model(fast, d_vocab=len(fast))
    ids = fast.encode("the cat", add_special_tokens=False)
    assert model.to_tokens("the cat").tolist() == [[fast.bos_token_id, *ids]]
    assert model.to_string(model.to_tokens("the cat", prepend_bos=False)[0]) == "the cat"


# ---------------------------------------------------------------- model methods
def test_to_tokens_prepends_bos_by_default(model):
    assert model.to_tokens("hi").tolist() == [[256, 104, 105]]
    assert model.to_tokens("hi", prepend_bos=False).tolist() == [[104, 105]]


def test_to_tokens_pads_right_or_left_with_bos_next_to_the_text(model):
    right = model.tokenize(["a", "abc"])
    left = model.tokenize(["a", "abc"], padding_side="left")
    assert right.tokens.tolist() == [[256, 97, 258, 258], [256, 97, 98, 99]]
    assert right.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert left.tokens.tolist() == [[258, 258, 256, 97], [256, 97, 98, 99]]
    assert left.attention_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert torch.equal(model.to_tokens(["a", "abc"], padding_side="left"), left.tokens)


def test_to_tokens_rejects_a_bad_padding_side(model):
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', got 'middle'"):
        model.to_tokens(["a"], padding_side="middle")


def test_prepend_bos_needs_a_bos_token():
    model = make_model(CharTokenizer("ab", bos_token=None), d_vocab=4)
    assert model.to_tokens("ab").tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="has no BOS token"):
        model.to_tokens("ab", prepend_bos=True)


def test_a_tokenizer_larger_than_the_vocabulary_is_named(model):
    small = make_model(ByteTokenizer(), d_vocab=200)
    with pytest.raises(ValueError, match="produced token id 256 but the model has d_vocab=200"):
        small.to_tokens("a")


def test_to_str_tokens_of_strings_and_ids(model):
    assert model.to_str_tokens("hé") == ["<bos>", "h", "\\xc3", "\\xa9"]
    assert model.to_str_tokens(["a", "bc"]) == [["<bos>", "a"], ["<bos>", "b", "c"]]
    tokens = model.to_tokens("ab")
    assert model.to_str_tokens(tokens) == ["<bos>", "a", "b"]
    assert model.to_str_tokens(tokens[0]) == ["<bos>", "a", "b"]
    assert model.to_str_tokens([97, 98]) == ["a", "b"]


def test_to_str_tokens_of_a_batch_says_to_go_row_by_row(model):
    with pytest.raises(ValueError, match="one sequence"):
        model.to_str_tokens(model.to_tokens(["a", "b"]))


def test_to_string_inverts_to_tokens(model):
    assert model.to_string(model.to_tokens("héllo", prepend_bos=False)[0]) == "héllo"
    assert model.to_string(model.to_tokens(["ab", "c"], prepend_bos=False)) == ["ab", "c<pad>"]


def test_to_single_token(model):
    assert model.to_single_token("a") == 97
    with pytest.raises(ValueError, match=r"'é' is 2 tokens, not one: \['\\\\xc3', '\\\\xa9'\]"):
        model.to_single_token("é")


def test_get_token_position_first_and_last(model):
    assert model.get_token_position("a", "banana") == 2  # after BOS
    assert model.get_token_position("a", "banana", mode="last") == 6
    assert model.get_token_position("a", "banana", prepend_bos=False) == 1
    assert model.get_token_position(110, model.to_tokens("banana")) == 3


def test_get_token_position_says_when_the_token_is_absent(model):
    with pytest.raises(ValueError, match=r"token 'z' \(id 122\) does not occur"):
        model.get_token_position("z", "banana")


def test_strings_need_a_tokenizer():
    model = make_model()
    for call in (model, model.to_tokens, model.to_str_tokens, model.generate):
        with pytest.raises(ValueError, match="no tokenizer"):
            call("hello")


def test_forward_of_a_string_equals_forward_of_its_tokens(model):
    torch.testing.assert_close(model("hello"), model(model.to_tokens("hello")), rtol=0, atol=0)
    loss_text = model("hello", return_type="loss")
    assert loss_text == model(model.to_tokens("hello"), return_type="loss")


def test_run_with_cache_and_run_with_hooks_accept_strings(model):
    _, cache = model.run_with_cache("hey", names_filter="blocks.0.hook_resid_post")
    assert cache["resid_post", 0].shape == (1, 4, 16)
    seen = []
    model.run_with_hooks("hey", fwd_hooks=[("hook_embed", lambda x, hook: seen.append(x.shape))])
    assert seen == [(1, 4, 16)]


def test_strings_bring_their_own_mask(model):
    with pytest.raises(TypeError, match="strings bring their own attention mask"):
        model(["a", "bc"], attention_mask=torch.ones(2, 3, dtype=torch.long))
