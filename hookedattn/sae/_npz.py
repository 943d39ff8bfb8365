"""Reading `.npz` files (numpy's zip of `.npy` arrays) strictly, without numpy or pickle.

Each `.npy` member starts with a header (`\\x93NUMPY`, a version, a Python dict literal
giving `descr`, `fortran_order` and `shape`); `headers` reads only those, so that names,
shapes and dtypes are checked before any array is read. Little-endian floats only
(`<f2`, `<f4`, `<f8`): an object array (which would need pickle) or anything else is
refused by name.
"""

import ast
import io
import math
import struct
import zipfile
from pathlib import Path

import torch

MAGIC = b"\x93NUMPY"
DTYPES = {"<f2": torch.float16, "<f4": torch.float32, "<f8": torch.float64}
_MAX_HEADER = 1 << 16


def headers(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each array's `(shape, dtype)` in the `.npz` at `path`, from the headers only."""
    with _open(path) as archive:
        out = {}
        for member in archive.namelist():
            with archive.open(member) as f:
                shape, dtype, _ = _header(f, path, member)
            out[member.removesuffix(".npy")] = (shape, dtype)
        return out


def read(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The arrays `names` of the `.npz` at `path`, as tensors (checked whole: a short
    member is refused)."""
    out = {}
    with _open(path) as archive:
        for name in names:
            member = f"{name}.npy"
            with archive.open(member) as f:
                shape, dtype, fortran = _header(f, path, member)
                n_bytes = math.prod(shape) * dtype.itemsize
                data = bytearray(f.read(n_bytes + 1))
            if len(data) != n_bytes:
                raise ValueError(
                    f"{path}: {member} holds {len(data):,} bytes of data, expected {n_bytes:,} "
                    f"for shape {shape} in {dtype} (a damaged file: download it again)"
                )
            flat = torch.frombuffer(data, dtype=dtype) if n_bytes else torch.zeros(0, dtype=dtype)
            if fortran:  # Fortran order stores the transpose in C order
                out[name] = flat.reshape(shape[::-1]).permute(*reversed(range(len(shape))))
            else:
                out[name] = flat.reshape(shape)
            out[name] = out[name].contiguous()
    return out


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is not a readable .npz (zip) file: {e}") from None


def _header(
    f: io.BufferedIOBase, path: Path, member: str
) -> tuple[tuple[int, ...], torch.dtype, bool]:
    where = f"{path}: {member}"
    if not member.endswith(".npy"):
        raise ValueError(f"{where} is not a .npy array (an .npz holds only those)")
    if f.read(6) != MAGIC:
        raise ValueError(f"{where} does not start as a .npy array does")
    major = f.read(2)[:1]
    size_bytes = {b"\x01": 2, b"\x02": 4, b"\x03": 4}.get(major)
    if size_bytes is None:
        raise ValueError(f"{where}: .npy format version {major!r} is not one of 1, 2, 3")
    (length,) = struct.unpack("<H" if size_bytes == 2 else "<I", f.read(size_bytes))
    if length > _MAX_HEADER:
        raise ValueError(f"{where}: a .npy header of {length:,} bytes is not a real header")
    try:
        header = ast.literal_eval(f.read(length).decode("latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: unreadable .npy header ({e})") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"{where}: a .npy header gives descr, fortran_order, shape: {header!r}")
    descr, shape = header["descr"], header["shape"]
    if descr not in DTYPES:
        raise ValueError(
            f"{where} is {descr!r}; coder weights are read as little-endian floats "
            f"({', '.join(DTYPES)}): other kinds, and object arrays, are not read"
        )
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(f"{where}: shape must be a tuple of sizes, got {shape!r}")
    return shape, DTYPES[descr], bool(header["fortran_order"])
