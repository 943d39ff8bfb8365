"""What the tests that hold hookedattn_tl against real TransformerLens 3.5.1 share.

TransformerLens runs in an environment of its own (`.ci/transformer_lens.sh` builds it and
links it at `~/.cache/hookedattn/transformer_lens-3.5.1/`; `HOOKEDATTN_TL_PYTHON` names
another interpreter), as a subprocess. Without it the tests skip, saying how to build it;
under CI (`CI` set) they fail instead, so CI always runs them. Not a test module.
"""

import importlib.util
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

ROOT = Path(__file__).resolve().parents[2]
VERSION = "3.5.1"

# float32 forwards of two implementations: their rounding differs, not their math.
TOLERANCE = dict(atol=2e-5, rtol=2e-5)


def require_peer_python(peer: str, link: str, build: str, variable: str) -> Path:
    """The interpreter of a peer library's environment (`peer`, e.g. "nnsight 0.8"), linked
    at `~/.cache/hookedattn/<link>` by `.ci/<build>` or named by the environment variable
    `variable`; skips the test without one (fails it under CI, which must run it)."""
    given = os.environ.get(variable)
    python = (
        Path(given) if given else Path.home() / ".cache" / "hookedattn" / link / "bin" / "python"
    )
    if not python.exists():
        message = f"{peer}'s environment is missing: run `bash .ci/{build}` (or set {variable})"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the comparison")
        pytest.skip(message)
    return python


def require_tl_python() -> Path:
    """TransformerLens's interpreter; skips the test without one (fails it under CI)."""
    return require_peer_python(
        f"TransformerLens {VERSION}", f"transformer_lens-{VERSION}", "transformer_lens.sh",
        "HOOKEDATTN_TL_PYTHON",
    )  # fmt: skip


TL4_VERSION = "4.3.0"


def require_tl4_python() -> Path:
    """TransformerLens 4's interpreter (`.ci/transformer_lens4.sh`); skips the test without
    one (fails it under CI)."""
    return require_peer_python(
        f"TransformerLens {TL4_VERSION}", f"transformer_lens-{TL4_VERSION}",
        "transformer_lens4.sh", "HOOKEDATTN_TL4_PYTHON",
    )  # fmt: skip


def run_in_tl4(script: str, given: dict[str, Any], folder: Path) -> Any:
    """`python scripts/<script> IN.pt OUT.pt` in TransformerLens 4's environment (offline)."""
    return run_script(require_tl4_python(), script, given, folder, None)


def run_in_tl(
    script: str, given: dict[str, Any], folder: Path, env: dict[str, str] | None = None
) -> Any:
    """`python scripts/<script> IN.pt OUT.pt` in TransformerLens's environment: its answer.
    Offline unless `env` (added to the environment) says otherwise."""
    return run_script(require_tl_python(), script, given, folder, env)


def run_script(
    python: Path, script: str, given: dict[str, Any], folder: Path, env: dict[str, str] | None
) -> Any:
    """`python scripts/<script> IN.pt OUT.pt` with another environment's interpreter: its
    answer. Offline unless `env` (added to the environment) says otherwise."""
    source, target = folder / "in.pt", folder / "out.pt"
    torch.save(given, source)
    command = [str(python), str(ROOT / "scripts" / script), str(source), str(target)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1") | (
        env or {}
    )
    env.pop("PYTHONPATH", None)  # TL's environment imports its own packages only
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(target, weights_only=False)


def script_module(name: str) -> Any:
    """`scripts/<name>.py`, imported from its file (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    """Equal structure, equal strings and ints, tensors and floats within TOLERANCE
    (its absolute part relative to the largest entry: without norms the stream grows)."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: {type(ours).__name__}, not a tensor"
        largest = max(1.0, float(theirs.abs().max())) if theirs.numel() else 1.0
        assert ours.dtype == theirs.dtype, f"{where}: {ours.dtype}, TL has {theirs.dtype}"
        assert_close(
            ours,
            theirs,
            atol=TOLERANCE["atol"] * largest,
            rtol=TOLERANCE["rtol"],
            msg=lambda m: f"{where}: {m}",
        )
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{where}: {type(ours).__name__}, not a dict"
        assert set(ours) == set(theirs), f"{where}: keys {set(ours) ^ set(theirs)} differ"
        for key, value in theirs.items():
            assert_same(ours[key], value, f"{where}/{key}")
    elif isinstance(theirs, list | tuple):
        assert isinstance(ours, list | tuple), f"{where}: {type(ours).__name__}, not a sequence"
        assert len(ours) == len(theirs), f"{where}: {len(ours)} items, TL has {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-5), where
    else:
        assert ours == theirs, where


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def assert_same_printout(ours: str, theirs: str) -> int:
    """The same text with the same numbers, each within one unit of its last printed digit
    (two roundings of values 2e-5 apart can differ there) or within TOLERANCE (a float
    printed in full). Returns how many numbers."""
    our_numbers, their_numbers = NUMBER.findall(ours), NUMBER.findall(theirs)
    assert NUMBER.split(ours) == NUMBER.split(theirs), "the printed text differs"
    assert len(our_numbers) == len(their_numbers)
    for i, (a, b) in enumerate(zip(our_numbers, their_numbers, strict=True)):
        decimals = len(b.split(".")[1].split("e")[0]) if "." in b else 0
        unit = 10.0**-decimals * (10.0 ** int(b.split("e")[1]) if "e" in b else 1.0)
        close = TOLERANCE["atol"] * max(1.0, abs(float(b))) + TOLERANCE["rtol"] * abs(float(b))
        allowed = max(unit * 1.01, close)
        assert abs(float(a) - float(b)) <= allowed, f"printed number {i}: {a}, TL {b}"
    return len(their_numbers)


# The demos' text: the indirect-object prompts of both demos and the Exploratory demo's
# other sentences, so that each name (" Mary", ...) is one token, as in GPT-2's vocabulary.
DEMO_CORPUS = [
    "When John and Mary went to the shops, John gave the bag to Mary",
    "When Tom and James went to the park, James gave the ball to Tom",
    "When Dan and Sid went to the shops, Sid gave an apple to Dan",
    "After Martin and Amy went to the park, Amy gave a drink to Martin",
    "After John and Mary went to the store, John gave a bottle of milk to Mary",
    "Research in interpretability seeks to explain the behaviour of models.",
]


def save_demo_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer (GPT-2's kind) trained on DEMO_CORPUS, saved in `folder`
    for `AutoTokenizer.from_pretrained(folder)`; `<|endoftext|>` is BOS, EOS and padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,  # more than the corpus has pairs: every word becomes one token
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(DEMO_CORPUS, trainer)
    special = "<|endoftext|>"
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=special, eos_token=special, pad_token=special
    )
    wrapped.save_pretrained(folder)
    return folder


def save_tiny_gpt2(folder: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 with every weight drawn at random (norm gains around 1, nonzero
    biases) and the demos' tokenizer (its vocabulary the model's), saved by transformers
    into `folder`."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    save_demo_tokenizer(folder)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=32, n_positions=64,
        vocab_size=len(AutoTokenizer.from_pretrained(folder)), bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.startswith("transformer.ln") or ".ln_" in name
            gain = gain and name.endswith(".weight")
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + gain)
    model.save_pretrained(folder)
    return folder


def save_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (RMS norms, rotary, grouped-query attention with 2 key/value heads,
    gated MLP) with every weight drawn at random and the demos' tokenizer, saved by
    transformers into `folder`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    save_demo_tokenizer(folder)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        vocab_size=len(AutoTokenizer.from_pretrained(folder)), bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = name.endswith("norm.weight")
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2 + gain)
    model.save_pretrained(folder)
    return folder


def random_weights(tl: Any, config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every parameter of a `tl.HookedTransformer` of `config` drawn at random, biases and
    gains too (gains around 1), so that every term of every sum matters."""
    model = tl.HookedTransformer(tl.HookedTransformerConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(t.shape, generator=generator) * 0.3 + name.endswith(".w")
        for name, t in model.state_dict().items()
    }


def demo_fixtures():
    """The module-scoped fixtures `ours` (`scripts/tl_demo.py` run on `given`, the module's
    fixture, after the alias line: hookedattn_tl installed as transformer_lens) and `theirs`
    (the same run by real TransformerLens, in a subprocess of its environment), for a demo's
    test module to bind by those names."""

    @pytest.fixture(scope="module")
    def ours(given) -> dict[str, Any]:
        """The demo run after the alias line."""
        import hookedattn_tl

        hookedattn_tl.install()
        try:
            return script_module("tl_demo").run_demo(**given)
        finally:
            hookedattn_tl.uninstall()

    @pytest.fixture(scope="module")
    def theirs(given, tmp_path_factory) -> dict[str, Any]:
        """The demo run by real TransformerLens, in a subprocess of its environment."""
        require_tl_python()
        return run_in_tl("tl_demo.py", given, tmp_path_factory.mktemp("tl"))

    return ours, theirs
