# Makes `import remat` find the package in integration/python and the library in the build directory that
# scripts/run_tests.sh exports as REMAT_BUILD_DIR (default: <repo>/build).
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "python"))
BUILD_DIR = Path(os.environ.get("REMAT_BUILD_DIR", ROOT / "build")).resolve()  # absolute: tests run subprocesses elsewhere
os.environ.setdefault("REMAT_LIBRARY", str(BUILD_DIR / "integration" / "libremat_torch.so"))
