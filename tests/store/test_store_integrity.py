"""Activation-store integrity : every byte read back is the byte written.

Each test damages one copy of a small store the way a disk, a careless copy or a hand edit
would, and checks that reading refuses it with a `StoreError` naming the file (or field)
and the remedy, instead of returning other rows. Before the store's format version 2 each
of these read back without error (the shards carried no hashes, and the manifest's fields
were trusted).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.store import RESID, byte_model

from hookedattn.store import ActivationStore, StoreError, collect_activations

TEXT = "import os\nprint(os.getcwd())\n" * 4
OPTIONS = dict(names=[RESID], batch_size=2, shard_contexts=4, progress=False)
REMEDY = r"rerun the same collect_activations call"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("template") / "store"
    collect_activations(byte_model(), [TEXT], out=out, **OPTIONS)  # 16 contexts: 4 shards
    return out


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    """A fresh copy of the template store, to damage."""
    return Path(shutil.copytree(template, tmp_path / "store"))


def header(path: Path) -> tuple[dict, int]:
    n = int.from_bytes(path.read_bytes()[:8], "little")
    return json.loads(path.read_bytes()[8 : 8 + n]), 8 + n


def rewrite_header(path: Path, edit) -> None:
    """Edit a shard's header in place, keeping the file's size (padded with spaces)."""
    data = path.read_bytes()
    entries, start = header(path)
    edit(entries)
    text = json.dumps(entries, separators=(",", ":")).encode()
    assert len(text) <= start - 8, "the edited header is longer than the original"
    path.write_bytes(data[:8] + text.ljust(start - 8) + data[start:])


def flip_a_bit(path: Path, key: str, at: int = 3) -> None:
    """Flip one bit inside tensor `key` of a safetensors file."""
    entries, start = header(path)
    begin, _ = entries[key]["data_offsets"]
    data = bytearray(path.read_bytes())
    data[start + begin + at] ^= 0x10
    path.write_bytes(bytes(data))


def edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


SHARD = "shard-00001.safetensors"


# ------------------------------------------------------------------ flipped bits
def test_a_flipped_bit_in_a_shards_activations_is_refused_when_read(store_dir):
    """Guards: data corrupted on disk is never returned as rows (hash on first read)."""
    flip_a_bit(store_dir / SHARD, RESID)
    store = ActivationStore(store_dir)  # opening reads headers and sizes only
    store.rows(RESID, 0)  # shard 0 is whole
    with pytest.raises(StoreError, match=rf"{SHARD} is damaged: the bytes of '{RESID}'.*{REMEDY}"):
        store.rows(RESID, 40)
    with pytest.raises(StoreError, match=rf"{SHARD} is damaged"):
        list(store.batches(RESID, 16))


def test_a_flipped_bit_in_the_tokens_is_refused(store_dir):
    """Guards: `origin` never reports a token other than the one the row was computed at."""
    flip_a_bit(store_dir / SHARD, "tokens", at=0)
    with pytest.raises(StoreError, match=rf"{SHARD} is damaged: the bytes of 'tokens'"):
        ActivationStore(store_dir).origin(40)


def test_a_flipped_bit_in_the_stats_file_is_refused(store_dir):
    """Guards: the normalisation an SAE trains with is the statistics that were written."""
    flip_a_bit(store_dir / "stats.safetensors", f"{RESID}.mean")
    with pytest.raises(StoreError, match=r"stats.safetensors is damaged.*writes it again"):
        ActivationStore(store_dir).stats(RESID)
    collect_activations(byte_model(), [TEXT], out=store_dir, **OPTIONS)  # the remedy
    assert ActivationStore(store_dir).stats(RESID).count == 128


def test_a_flipped_bit_in_a_store_in_progress_is_refused(store_dir):
    """Guards: a store still being written checks each shard against its own header's hashes."""
    edit_manifest(store_dir, lambda m: m.update(status="writing", shards=[
        {k: r[k] for k in ("index", "file", "contexts", "rows")} for r in m["shards"]
    ]))  # fmt: skip
    (store_dir / "stats.safetensors").unlink()
    flip_a_bit(store_dir / SHARD, RESID)
    store = ActivationStore(store_dir)
    assert not store.complete
    with pytest.raises(StoreError, match=rf"{SHARD} is damaged"):
        store.rows(RESID, slice(None))


def test_verify_content_false_skips_the_hashes_and_verify_lists_every_damaged_file(store_dir):
    """Guards: the switch only skips hashing (headers are still checked), and `verify()`
    names every damaged file at once, with the remedy."""
    flip_a_bit(store_dir / SHARD, RESID)
    flip_a_bit(store_dir / "shard-00003.safetensors", "tokens", at=0)
    unchecked = ActivationStore(store_dir, verify_content=False)
    assert unchecked.rows(RESID, slice(None)).shape == (len(unchecked), 16)
    with pytest.raises(StoreError, match=r"2 damaged file\(s\) .*shard-00001.*shard-00003"):
        unchecked.verify()


def test_a_damaged_shard_is_computed_again_by_rerunning_the_collection(store_dir):
    """Guards: the remedy the errors give works: the rerun recomputes only that shard."""
    flip_a_bit(store_dir / SHARD, RESID)
    again = collect_activations(byte_model(), [TEXT], out=store_dir, **OPTIONS)
    assert again.written == (1,)
    ActivationStore(store_dir).verify()


# ------------------------------------------------------------------ shards in the wrong place
def test_a_shard_copied_over_another_is_refused(store_dir):
    """Guards: shard identity (index, contexts) is checked, not only the run's fingerprint."""
    shutil.copyfile(store_dir / SHARD, store_dir / "shard-00002.safetensors")
    store = ActivationStore(store_dir)  # same size: the manifest's sizes agree
    with pytest.raises(StoreError, match=r"shard-00002.safetensors holds shard 1 .*not shard 2"):
        store.rows(RESID, 2 * 32)


def test_two_swapped_shards_are_refused(store_dir):
    """Guards: swapping two whole shards does not renumber their rows."""
    first, second = store_dir / "shard-00000.safetensors", store_dir / SHARD
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    with pytest.raises(StoreError, match=r"shard-00000.safetensors holds shard 1"):
        ActivationStore(store_dir).rows(RESID, 0)


# ------------------------------------------------------------------ headers edited in place
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h: h[RESID].update(dtype="F16"), r"describes 'blocks.1.hook_resid_pre' as"),
        (lambda h: h[RESID]["shape"].__setitem__(0, 31), r"describes 'blocks.1.hook_resid_pre' as"),
        (
            lambda h: h["tokens"].update(data_offsets=[o + 4 for o in h["tokens"]["data_offsets"]]),
            r"do not lie end to end|data_offsets|describes",
        ),
    ],
    ids=["F32-to-F16", "smaller-shape", "shifted-offsets"],
)
def test_a_header_edited_in_place_is_refused_when_the_shard_is_opened(store_dir, edit, message):
    """Guards: header edits that keep the file's size pass no size check and return garbage;
    the header is checked against the manifest's layout before any tensor is read."""
    rewrite_header(store_dir / SHARD, edit)
    store = ActivationStore(store_dir, verify_content=False)
    with pytest.raises(StoreError, match=message):
        store.rows(RESID, 40)


def test_a_header_length_of_2_to_the_40_is_refused_without_reading(store_dir):
    """Guards: a corrupted length field never makes the reader allocate a terabyte."""
    path = store_dir / SHARD
    path.write_bytes((1 << 40).to_bytes(8, "little") + path.read_bytes()[8:])
    with pytest.raises(StoreError, match=r"header length 1,099,511,627,776 does not fit"):
        ActivationStore(store_dir).rows(RESID, 40)


# ------------------------------------------------------------------ the manifest edited
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(rows_per_context=4), r"rows_per_context=4 is not the packing's"),
        (
            lambda m: (m.update(rows_per_context=4), m["packing"].update(context=4)),
            r"no longer digest to its fingerprint",
        ),
        (lambda m: m["shards"].pop(2), r"lists 3 shard records, .* make 4: a record was deleted"),
        (
            lambda m: (
                m["shards"][0].update(contexts=m["shards"][1]["contexts"]),
                m["shards"][1].update(contexts=[0, 4]),
            ),
            r"shard record 0 says \{'contexts': \[4, 8\]\}",
        ),
        (lambda m: m.update(shard_contexts=3), r"no longer digest to its fingerprint"),
    ],
    ids=[
        "rows_per_context",
        "rows_per_context-and-packing",
        "deleted-record",
        "swapped-contexts",
        "shard_contexts",
    ],
)
def test_an_edited_manifest_is_refused_by_name(store_dir, edit, message):
    """Guards: a hand-edited manifest gives wrong rows or counts; now it is refused."""
    edit_manifest(store_dir, edit)
    with pytest.raises(StoreError, match=message):
        ActivationStore(store_dir)


@pytest.mark.parametrize(
    "field",
    ["names", "dtype", "rows_per_context", "shards", "packing", "model", "fingerprint",
     "row_shapes", "stats_sha256"],
)  # fmt: skip
def test_a_manifest_missing_a_field_is_a_store_error_naming_it(store_dir, field):
    """Guards: a missing field raised a bare KeyError (or TypeError) from deep inside."""
    edit_manifest(store_dir, lambda m: m.pop(field))
    with pytest.raises(StoreError, match=rf"{field} is missing, expected"):
        ActivationStore(store_dir)


@pytest.mark.parametrize(
    ("field", "value"),
    [("names", 5), ("dtype", "int8"), ("rows_per_context", "8"), ("shards", {}),
     ("batch_size", True), ("status", "done")],
)  # fmt: skip
def test_a_manifest_field_of_the_wrong_type_is_a_store_error_naming_it(store_dir, field, value):
    """Guards: a field of the wrong type raised TypeError or gave wrong counts."""
    edit_manifest(store_dir, lambda m: m.update({field: value}))
    with pytest.raises(StoreError, match=rf"{field} is {value!r}"):
        ActivationStore(store_dir)


def test_a_manifest_nested_too_deeply_is_a_store_error(store_dir):
    """Guards: a RecursionError from the JSON parser."""
    (store_dir / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match=r"not valid JSON \(nested too deeply\)"):
        ActivationStore(store_dir)


def test_a_complete_store_reads_back_and_verifies(store_dir):
    """The undamaged copy: opened, read every way and verified without a complaint."""
    store = ActivationStore(store_dir)
    store.verify()
    assert store.manifest["shards"][1]["tensors"][RESID]["dtype"] == "F32"
    rows = torch.cat(list(store.batches(RESID, 16)))
    assert torch.equal(rows, store.rows(RESID, slice(None)))
