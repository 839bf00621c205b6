"""Load pickles that should hold only plain data (RefCOCO+'s `refs(unc).p`) without running code.

A pickle can name any importable callable and have it called on load. This unpickler admits one
global only, `_codecs.encode` (how protocol 2 spells a bytes object; it turns text into bytes and
nothing else), so only plain containers and scalars (dict, list, tuple, str, bytes, int, float,
bool, None) can come out of it.
"""

from __future__ import annotations

import io
import pickle

from .errors import DataFormatError


class UnsafePickleError(pickle.UnpicklingError):
    pass


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("_codecs", "encode"):
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: this file should hold only plain lists, dicts "
            "and scalars, and a pickle that names a class or function could run code"
        )


def load_plain_pickle(path) -> object:
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise DataFormatError(path, "not a readable pickle: the file is empty (download it again)")
    try:
        # encoding="latin1" reads the Python 2 pickles that REFER's files were written with.
        return _PlainDataUnpickler(io.BytesIO(data), encoding="latin1").load()
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{path}: {exc}") from None
    except Exception as exc:  # a truncated or corrupt pickle can fail in many ways, none naming the file
        raise DataFormatError(
            path, f"not a readable pickle, truncated or corrupt ({type(exc).__name__}: {exc}); download it again"
        ) from None
