"""Training data that needs no download: the Python standard library's own source, as bytes.

The corpus is the top-level `*.py` files of the standard library of the running Python
(`sysconfig.get_paths()["stdlib"]`, no subpackages, no site-packages), read as UTF-8 bytes
and tokenized by `ByteTokenizer` (token id = byte value, `<bos>` = 256). A file is held
out when the SHA-256 of its name is 0 modulo 10 (`is_heldout`): the rule depends on the
name only, so the same file lands on the same side on every machine and in every Python
version, and files that come and go between versions do not move any other file.

The exact bytes differ between Python versions, so the `CorpusManifest` records which
files were read, their sizes and a digest of their contents; training stores it with each
checkpoint.

Synthetic data, to give induction something to learn from early on: `repeated_random_tokens`
(a random segment repeated, as in Olsson et al. 2022, section "Induction heads").
"""

import dataclasses
import hashlib
import sys
import sysconfig
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core.tokenizers import ByteTokenizer

BOS = ByteTokenizer().bos_token_id
VOCAB_SIZE = ByteTokenizer().vocab_size
N_BYTES = 256
HELDOUT_MODULUS = 10


def stdlib_root() -> Path:
    """The directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str) -> bool:
    """Whether a file belongs to the held-out split: SHA-256 of its name, modulo 10, is 0."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).hexdigest()
    return int(digest, 16) % HELDOUT_MODULUS == 0


@dataclasses.dataclass(frozen=True)
class CorpusManifest:
    """Which bytes a corpus holds: the files of each split, their sizes, one digest."""

    root: str
    python_version: str
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]
    train_bytes: int
    heldout_bytes: int
    sha256: str

    def summary(self) -> dict:
        """A JSON-ready record (file lists included) to store with a checkpoint."""
        return dataclasses.asdict(self)

    def __repr__(self) -> str:
        return (
            f"CorpusManifest(python {self.python_version}, {len(self.train_files)} train files "
            f"/ {self.train_bytes:,} bytes, {len(self.heldout_files)} held-out files / "
            f"{self.heldout_bytes:,} bytes, sha256 {self.sha256[:12]})"
        )


@dataclasses.dataclass(frozen=True)
class ByteCorpus:
    """The train and held-out splits as byte tensors (file after file), and their manifest."""

    train: Int[Tensor, " train_bytes"]
    heldout: Int[Tensor, " heldout_bytes"]
    manifest: CorpusManifest

    def __repr__(self) -> str:
        return f"ByteCorpus({self.manifest!r})"


def load_stdlib_corpus(root: str | Path | None = None) -> ByteCorpus:
    """Read the top-level `*.py` files of `root` (default: the stdlib) into a `ByteCorpus`."""
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    names = sorted(p.name for p in root.glob("*.py") if p.is_file())
    splits: dict[bool, list[str]] = {False: [], True: []}
    for name in names:
        splits[is_heldout(name)].append(name)
    if not splits[False] or not splits[True]:
        raise ValueError(
            f"{root} has {len(names)} *.py files, too few for both a train and a held-out "
            f"split (a file is held out when sha256(name) % {HELDOUT_MODULUS} == 0)"
        )
    digest = hashlib.sha256()
    data = {}
    for held, files in splits.items():
        chunks = []
        for name in files:
            content = (root / name).read_bytes()
            digest.update(f"{name}\0{len(content)}\0".encode())
            digest.update(content)
            chunks.append(content)
        data[held] = b"".join(chunks)
    manifest = CorpusManifest(
        root=str(root),
        python_version=".".join(map(str, sys.version_info[:3])),
        train_files=tuple(splits[False]),
        heldout_files=tuple(splits[True]),
        train_bytes=len(data[False]),
        heldout_bytes=len(data[True]),
        sha256=digest.hexdigest(),
    )
    return ByteCorpus(_as_ids(data[False]), _as_ids(data[True]), manifest)


def _as_ids(data: bytes) -> Int[Tensor, " byte"]:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def text_windows(
    data: Int[Tensor, " byte"], n_seq: int, seq_len: int, generator: torch.Generator
) -> Int[Tensor, "batch pos"]:
    """`n_seq` windows of `seq_len - 1` consecutive bytes at random offsets, each after `<bos>`."""
    if data.numel() < seq_len:
        raise ValueError(f"the data has {data.numel()} bytes, fewer than seq_len={seq_len}")
    starts = torch.randint(0, data.numel() - seq_len + 2, (n_seq,), generator=generator)
    offsets = starts[:, None] + torch.arange(seq_len - 1)
    return _with_bos(data[offsets])


def heldout_windows(
    data: Int[Tensor, " byte"], n_seq: int, seq_len: int
) -> Int[Tensor, "batch pos"]:
    """`n_seq` evenly spaced windows (as `text_windows`) covering the data: a fixed eval set."""
    if data.numel() < seq_len:
        raise ValueError(f"the data has {data.numel()} bytes, fewer than seq_len={seq_len}")
    starts = torch.linspace(0, data.numel() - seq_len + 1, n_seq).long()
    return _with_bos(data[starts[:, None] + torch.arange(seq_len - 1)])


def repeated_random_tokens(
    n_seq: int,
    seq_len: int,
    period: int | tuple[int, int],
    generator: torch.Generator,
) -> Int[Tensor, "batch pos"]:
    """`<bos>` then a segment of uniformly random bytes repeated until `seq_len` tokens.

    `period` is the segment length, or a `(low, high)` range from which each sequence draws
    its own (inclusive); varying it keeps a model from predicting the repeat by position
    alone, which even a one-layer model could learn for a fixed period.
    """
    low, high = (period, period) if isinstance(period, int) else period
    if not 1 <= low <= high:
        raise ValueError(f"period must be >= 1 (a range low <= high), got {period}")
    periods = torch.randint(low, high + 1, (n_seq, 1), generator=generator)
    segments = torch.randint(0, N_BYTES, (n_seq, high), generator=generator)
    index = torch.arange(seq_len - 1)[None, :] % periods
    return _with_bos(segments.gather(1, index))


def _with_bos(body: Int[Tensor, "batch body_pos"]) -> Int[Tensor, "batch pos"]:
    bos = torch.full((body.shape[0], 1), BOS, dtype=torch.long)
    return torch.cat([bos, body.long()], dim=1)
