"""Shared by ``tests/`` and ``benchmarks/``: quiet torch threads, no hub access, and the real data sets."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_DEFAULT_DATA = Path(__file__).resolve().parent.parent / "shared" / "data"
if "RLVR_DATA_DIR" not in os.environ and _DEFAULT_DATA.is_dir():
    os.environ["RLVR_DATA_DIR"] = str(_DEFAULT_DATA)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true", default=False,
                     help="regression suite: run each comparison with the tiny model for two steps (a smoke test)")


@pytest.fixture
def data_dir() -> Path:
    """The real data sets (../shared/data); tests and benchmarks that need them skip where they are absent."""
    root = os.environ.get("RLVR_DATA_DIR")
    if not root or not Path(root).is_dir():
        pytest.skip("RLVR_DATA_DIR is not set to the shared data folder")
    return Path(root)
