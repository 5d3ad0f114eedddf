# Shared setup for the model-family tests: `import model` from scripts/, two CPU
# threads, and no TorchScript deprecation noise (torch 2.11 warns on every
# torch.jit.script/save/load; LoongForge uses TorchScript on purpose).
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
torch.set_num_threads(2)


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", r"ignore:.*torch\.jit\.\w+` is deprecated:DeprecationWarning")


@pytest.fixture(autouse=True)
def _two_threads():
    torch.set_num_threads(2)
    yield
