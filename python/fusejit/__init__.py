"""fusejit: y = BatchNorm1d(scale * (x W^T + b)) as one run-time compiled CUDA op.

`import fusejit` loads only the C++ extension (no PyTorch); `import fusejit.torch` (or the
attribute `fusejit.torch`) brings the PyTorch op and module `LinearScaleBatchNorm1d`.
"""
import importlib as _importlib

try:
    _C = _importlib.import_module("._C", __name__)
except ImportError as _e:  # a source checkout without a build, or libfusejit.so missing
    _C = None
    _C_import_error = f"{type(_e).__name__}: {_e}"
else:
    _C_import_error = None


def _version() -> str:
    if _C is not None:
        return _C.version()
    try:
        from importlib.metadata import version

        return version("fusejit")
    except Exception:
        return "0+unknown"


__version__ = _version()
__all__ = ["__version__"]


def __getattr__(name):
    # PyTorch is optional and heavy: fusejit.torch is imported on first use only.
    if name == "torch":
        return _importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
