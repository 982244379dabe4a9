"""Calls by native address (kernels/native.py) and the layer loop built on them: a kernel
called by address computes what its dispatcher computes, a call site whose arguments do not
fit the declared signature does not compile, errors propagate, and a decode step makes the
same few calls from Python whatever the number of layers."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from numba import njit
from numba.core.errors import TypingError
from numba.core.registry import CPUDispatcher
from tiny_models import write_tiny_model

from edgeinfer.api import Model
from edgeinfer.kernels import native, ops
from edgeinfer.kernels.native import call


@njit(cache=True)
def _run_add(addr, x, y):
    call("add_inplace", addr, (x, y))


@njit(cache=True)
def _run_add_wrong(addr, x, y):
    call("add_inplace", addr, (x, y[0]))


@njit
def _raising(x, y):
    if x.shape[0] != y.shape[0]:
        raise ValueError("rows differ")
    x += y


def test_call_by_address_runs_the_kernel():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3, 5), dtype=np.float32)
    expected = x + y
    _run_add(native.address(ops.add_inplace, "add_inplace"), x, y)
    np.testing.assert_array_equal(x, expected)


def test_call_with_arguments_off_the_signature_does_not_compile():
    x = np.zeros((3, 5), np.float32)
    with pytest.raises(TypingError, match="do not fit"):
        _run_add_wrong(native.address(ops.add_inplace, "add_inplace"), x, x.copy())


def test_errors_raised_by_the_kernel_reach_the_caller():
    addr = native.address(_raising, "add_inplace")
    x = np.zeros((3, 5), np.float32)
    _run_add(addr, x, np.ones((3, 5), np.float32))
    assert (x == 1).all()
    with pytest.raises(ValueError, match="rows differ"):
        _run_add(addr, x, np.ones((2, 5), np.float32))


def test_weight_rows_view_the_memory_read_only():
    w = np.arange(24, dtype=np.uint8).reshape(4, 6)

    @njit
    def rows(addr):
        return native.weight_rows(addr, 4, 6).copy()

    np.testing.assert_array_equal(rows(w.ctypes.data), w)
    view = native.weight_rows_from_python(w.ctypes.data, 4, 6)
    assert not view.flags.writeable and np.shares_memory(view, w)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_decode_step_calls_few_kernels_from_python_at_any_depth(tmp_path, arch, monkeypatch):
    """The whole layer stack is one compiled call: a model with 4 times the layers makes the
    same calls per decode step (embedding, layers, output norm, quantize, output matmul...)."""
    counts = []
    for n_layer in (1, 4):
        path = write_tiny_model(tmp_path / f"{arch}{n_layer}.gguf", arch, Q.Q8_0,
                                n_layer=n_layer)
        model = Model.load(path, n_ctx=32, n_slots=2)
        model.logits([1, 2, 3])
        calls = []
        original = CPUDispatcher.__call__

        def counting(self, *args, **kw):
            calls.append(self.py_func.__name__)
            return original(self, *args, **kw)

        monkeypatch.setattr(CPUDispatcher, "__call__", counting)
        tokens = np.array([4, 5], np.int32)
        logits = np.zeros((2, model.config.n_vocab), np.float32)
        model.transformer.forward(tokens, np.array([3, 3], np.int32),
                                  np.array([0, 1], np.int32), np.arange(2, dtype=np.int32),
                                  logits)
        monkeypatch.setattr(CPUDispatcher, "__call__", original)
        assert "run_layers" in calls
        counts.append(len(calls))
    assert counts[0] == counts[1] <= 8
