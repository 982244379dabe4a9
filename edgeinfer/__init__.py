"""edgeinfer: local CPU/edge inference of quantized GGUF models."""

__version__ = "0.1.0"

__all__ = ["Model", "__version__"]


def __getattr__(name: str):
    # Lazy: `import edgeinfer` (and `edgeinfer --help`) must not pull in numba.
    if name == "Model":
        from edgeinfer.api import Model

        return Model
    raise AttributeError(name)
