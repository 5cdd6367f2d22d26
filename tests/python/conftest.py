# Makes `import remat` find the package in integration/python and the library in the build directory that
# scripts/run_tests.sh exports as REMAT_BUILD_DIR (default: <repo>/build).
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "python"))
BUILD_DIR = Path(os.environ.get("REMAT_BUILD_DIR", ROOT / "build")).resolve()  # absolute: tests run subprocesses elsewhere
os.environ.setdefault("REMAT_LIBRARY", str(BUILD_DIR / "integration" / "libremat_torch.so"))


@pytest.fixture(autouse=True)
def _remat_off_after_each_test():
    """No test leaves remat on for the next one (a test that failed half-way included)."""
    yield
    remat = sys.modules.get("remat")  # only if the test loaded it
    if remat is not None and remat.is_enabled():
        remat.disable()
