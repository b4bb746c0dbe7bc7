"""Reading SkyRL's training-input dumps without unpickling arbitrary objects: a restricted
unpickler that admits only the names such a dump holds (mapped to gaecli's own stand-ins,
never to SkyRL's or anyone's code), and the decoding of the batch's tensor entries into
numpy arrays (see docs/import.md, "gae import skyrl").

SkyRL's ``TrainingInputBatch.save`` is ``pickle.dump(batch)``; the batch reduces to
``_rebuild_tensor_batch(TrainingInputBatch, state)`` with ``state`` a dict of
``batch_dict`` (tensor entries: raw bytes plus shape and dtype, or ``torch.save`` bytes),
``batch_size``, ``device`` (a ``torch.device``) and ``metadata`` (plain values)."""

from __future__ import annotations

import io
import math
import pickle
from typing import Any

import numpy as np

from gaecli.errors import GAEInputError, GAEUsageError
from gaecli.importers.common import first_line, open_binary
from gaecli.importers.values import describe, shown
from gaecli.io.filesystem import AnyPath, RemotePath

TRAINING_BATCH_MODULE = "skyrl.backends.skyrl_train.training_batch"
INPUT_BATCH = "TrainingInputBatch"
NUMPY_DTYPES = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
)
"""The ``dtype`` strings of a ``"numpy"`` tensor entry gaecli decodes (no object, string or
complex arrays)."""
# numpy's own short names of the same types, as a pickled numpy scalar names its dtype
NUMPY_SCALAR_SPECS = frozenset(("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"))


class _Refused(Exception):
    """A name (or a call of an admitted stand-in) that a SkyRL training-input dump does not hold."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


class _BatchClass:
    """The stand-in of one of SkyRL's batch classes: a marker passed to
    :func:`_rebuild_tensor_batch`, with no state of its own."""

    __slots__ = ()


BATCH_CLASSES = {
    name: type(name, (_BatchClass,), {"__slots__": ()}) for name in ("TensorBatch", INPUT_BATCH, "TrainingOutputBatch")
}


class Rebuilt:
    """What the dump's ``_rebuild_tensor_batch(cls, state)`` gave: the batch class's name
    (``kind``) and the state it was given, untouched."""

    __slots__ = ("kind", "state")

    def __init__(self, kind: str, state: Any):
        self.kind = kind
        self.state = state


def _rebuild_tensor_batch(cls: Any, state: Any) -> Rebuilt:
    if not (isinstance(cls, type) and issubclass(cls, _BatchClass)):
        raise _Refused(f"{TRAINING_BATCH_MODULE}._rebuild_tensor_batch of {shown(cls)}")
    return Rebuilt(cls.__name__, state)


def _device(kind: Any, index: Any = None) -> str:
    """``torch.device(kind[, index])`` as its text (``cpu``, ``cuda:0``); nothing but a
    string and an optional integer is taken."""
    if not isinstance(kind, str) or index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        raise _Refused(f"torch.device of {shown(kind)}, {shown(index)}")
    return kind if index is None else f"{kind}:{index}"


class _NumpyDtype:
    """The stand-in of ``numpy.dtype(spec, align, copy)`` of a pickled numpy scalar: the
    spec (a bool, integer or float type) and the byte order its state gives; numpy's own
    ``__setstate__`` never sees the dump's state."""

    __slots__ = ("spec", "byteorder")

    def __init__(self, spec: Any, align: Any = False, copy: Any = True):
        if not isinstance(spec, str) or spec not in NUMPY_SCALAR_SPECS:
            raise _Refused(f"numpy.dtype of {shown(spec)}")
        self.spec = spec
        self.byteorder = "="

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise _Refused(f"numpy.dtype with the state {shown(state)}")
        self.byteorder = state[1]


def _numpy_scalar(dtype: Any, data: Any) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)`` (a numpy number in the metadata) as
    the Python number it holds."""
    if not isinstance(dtype, _NumpyDtype) or not isinstance(data, bytes):
        raise _Refused(f"numpy scalar of {shown(dtype)}, {shown(data)}")
    numpy_dtype = np.dtype(dtype.spec).newbyteorder(dtype.byteorder)
    if len(data) != numpy_dtype.itemsize:
        raise _Refused(f"numpy scalar of {len(data)} bytes for a {dtype.spec}")
    return np.frombuffer(data, dtype=numpy_dtype)[0].item()


ADMITTED = {
    (TRAINING_BATCH_MODULE, "_rebuild_tensor_batch"): _rebuild_tensor_batch,
    **{(TRAINING_BATCH_MODULE, name): cls for name, cls in BATCH_CLASSES.items()},
    ("torch", "device"): _device,
    ("numpy", "dtype"): _NumpyDtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
}
"""Every name a dump may hold, and what gaecli puts in its place (none of them SkyRL's,
torch's or numpy's own callables)."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain values (numbers, strings, bytes, lists, tuples,
    dicts) and the names of :data:`ADMITTED`, as gaecli's stand-ins; any other name, and
    any persistent id, raises before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        admitted = ADMITTED.get((module, name))
        if admitted is None:
            raise _Refused(f"{module}.{name}")
        return admitted

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"the persistent id {shown(pid)}")


def load_training_input(path: AnyPath) -> Any:
    """The object a SkyRL dump file holds, through :class:`RestrictedUnpickler` (a
    :class:`Rebuilt` for a dump SkyRL wrote). :class:`GAEInputError` for a refused name;
    :class:`GAEUsageError` for a file that cannot be read or is no pickle (text, truncated,
    random bytes)."""
    try:
        with open_binary(path) as stream:
            source = io.BytesIO(stream.read()) if isinstance(path, RemotePath) else stream
            return RestrictedUnpickler(source).load()
    except GAEUsageError:
        raise
    except _Refused as refused:
        raise GAEInputError(
            f"{path}: refused: the dump holds a pickled Python object ({refused.name}) that a SkyRL "
            f"training-input dump does not; gaecli never unpickles arbitrary objects"
        ) from None
    except OSError as error:
        raise GAEUsageError(f"{path}: cannot read ({error.strerror or error})") from None
    except Exception as error:  # noqa: BLE001 - foreign bytes fail the unpickler in many ways
        raise GAEUsageError(
            f"{path}: cannot read as a SkyRL dump (a pickle file) ({type(error).__name__}: {first_line(error)})"
        ) from None


# ----------------------------------------------------------------------------- tensor entries


def entry_array(entry: Any, where: str) -> np.ndarray:
    """One ``batch_dict`` entry as a numpy array: ``{"format": "numpy", "data", "shape",
    "dtype"}`` (an entry without ``format``, from older SkyRL, is read so too) or
    ``{"format": "torch", "data"}`` (``torch.save`` bytes, loaded with
    ``torch.load(weights_only=True)``; bfloat16 and float16 become float32).
    :class:`GAEInputError` naming ``where`` for anything else."""
    if not isinstance(entry, dict):
        raise GAEInputError(f"{where} is {describe(entry)}, expected a tensor entry (a dict of format and data)")
    kind = entry.get("format", "numpy")
    if kind == "numpy":
        return _numpy_entry(entry, where)
    if kind == "torch":
        return _torch_entry(entry.get("data"), where)
    if kind == "tensor_list":
        raise GAEInputError(f"{where} is a tensor list, expected one [batch_size, R] tensor")
    raise GAEInputError(f"{where} has the format {shown(kind)}; SkyRL writes 'numpy', 'torch' or 'tensor_list'")


def _numpy_entry(entry: dict, where: str) -> np.ndarray:
    data, shape, dtype = entry.get("data"), entry.get("shape"), entry.get("dtype")
    if not isinstance(data, (bytes, bytearray)):
        raise GAEInputError(f"{where}['data'] is {shown(data)}, expected the array's bytes")
    if not isinstance(dtype, str) or dtype not in NUMPY_DTYPES:
        raise GAEInputError(f"{where}['dtype'] is {shown(dtype)}, expected one of {', '.join(sorted(NUMPY_DTYPES))}")
    if not _is_shape(shape):
        raise GAEInputError(f"{where}['shape'] is {shown(shape)}, expected a tuple of lengths")
    needed = math.prod(shape) * np.dtype(dtype).itemsize
    if needed != len(data):
        raise GAEInputError(
            f"{where} holds {len(data):,} bytes, but a {dtype} array of shape {tuple(shape)} has {needed:,}"
        )
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))


def _is_shape(shape: Any) -> bool:
    """A tuple (or list) of at most 64 lengths (numpy's most dimensions), each an int ≥ 0."""
    if not isinstance(shape, (tuple, list)) or len(shape) > 64:
        return False
    return all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)


def _torch_entry(data: Any, where: str) -> np.ndarray:
    import torch

    if not isinstance(data, (bytes, bytearray)):
        raise GAEInputError(f"{where}['data'] is {shown(data)}, expected torch.save bytes")
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - the weights-only unpickler refuses or fails in many ways
        if "Weights only load failed" in str(error):
            raise GAEInputError(
                f"{where}: refused: its torch.save bytes hold a pickled Python object besides a tensor; "
                f"gaecli loads them with torch.load(weights_only=True) and never unpickles arbitrary objects"
            ) from None
        raise GAEInputError(f"{where}: cannot read its torch.save bytes ({first_line(error)})") from None
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        raise GAEInputError(f"{where}: its torch.save bytes hold {describe(tensor)}, expected a dense tensor")
    if tensor.dtype.is_complex:
        raise GAEInputError(f"{where} is a {tensor.dtype} tensor, expected real numbers")
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.detach().numpy()
