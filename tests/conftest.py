import zlib

import numpy as np
import pytest
import torch

from onnx2torch_rnn import register_converter
from tests.helpers import registry_restored

# pytest-xdist runs one worker per core: one torch thread each avoids oversubscribing the machine.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _per_test_rng(request):
    """Test modules draw inputs from a module-level ``RNG``: reseed it per test so each test's data does not depend
    on which tests ran before it in the same (xdist) worker."""
    if hasattr(request.module, "RNG"):
        request.module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def registry():
    """``register_converter`` for this test only: what the test registers or replaces is undone when it ends."""
    with registry_restored():
        yield register_converter
