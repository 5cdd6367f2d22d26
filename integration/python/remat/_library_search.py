"""Finding a shared library remat built: an explicit path from an environment variable wins, else the first of
the candidate paths that exists. One place for the rule and its error messages (libremat_torch.so at import,
libremat_cuda.so for the CUDA allocator)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Type


def find_library(variable: str, candidates: List[Path], error: Type[Exception], not_found: str) -> Path:
    """The file $`variable` names (`error` if it names none), else the first existing candidate, else `error` with
    `not_found` and the paths searched."""
    explicit = os.environ.get(variable)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise error(f"remat: {variable}={explicit!r} does not name a file")
        return path
    for path in candidates:
        if path.is_file():
            return path
    searched = "\n  ".join(str(p) for p in candidates)
    raise error(f"{not_found} Searched:\n  {searched}")
