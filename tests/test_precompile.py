"""The compile helper of a cold load (kernels/precompile.py): what the child process caches
must be what the loading process then asks for, or it only burns the second core."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import write_tiny_model

from edgeinfer.kernels import precompile

# In a fresh process on the child's cache: how many kernels the layer loop's attention and
# row kernels still need compiled (numba raises "numba:compile" only on a cache miss).
# The load starts Numba's thread pool first (process.set_threads): the cached parallel kernels
# link against its symbols.
COUNT_COMPILES = """
import sys
from numba.core import event
from edgeinfer.process import set_threads
from edgeinfer.kernels import precompile
set_threads(None)
class Count(event.Listener):
    n = 0
    def on_start(self, ev): Count.n += 1
    def on_end(self, ev): pass
with event.install_listener("numba:compile", Count()):
    precompile.compile_layer_kernels(False)
    precompile.compile_products(sys.argv[1])
print(Count.n)
"""


def _run(args, cache_dir):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # compiles every layer kernel into an empty cache: 45 s on 2 vCPUs
def test_the_child_caches_what_the_load_asks_for(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_tiny_model(model, "llama", Q.Q4_1)
    cold = _run(["-c", COUNT_COMPILES, model], tmp_path / "cold")
    assert cold.returncode == 0, cold.stderr
    assert int(cold.stdout) > 0  # an empty cache compiles: the count can tell
    child = _run(["-m", "edgeinfer.kernels.precompile", model], tmp_path / "warm")
    assert child.returncode == 0, child.stderr
    warm = _run(["-c", COUNT_COMPILES, model], tmp_path / "warm")
    assert warm.returncode == 0, warm.stderr
    assert int(warm.stdout) == 0


def test_stop_ends_a_running_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    precompile.stop(child)
    assert child.poll() is not None
    precompile.stop(child)  # already ended: nothing to do
    precompile.stop(None)
