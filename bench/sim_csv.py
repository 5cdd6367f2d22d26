"""Helpers shared by the bench/ scripts that summarize remat-sim CSV output (stdlib only)."""
import csv
import sys


def trace_label(name):
    """'resnet32-56-9000000000.0-...log' -> 'resnet32 (56)': the model and its batch size."""
    stem = name[:-4] if name.endswith(".log") else name
    parts = stem.split("-")
    return f"{parts[0]} ({parts[1]})" if len(parts) > 1 and parts[1].isdigit() else stem


def read_rows(argv, usage):
    """The rows of the one CSV named in argv; exits with `usage` or a clear message otherwise."""
    if len(argv) != 1:
        sys.exit(f"usage: {usage}")
    with open(argv[0], newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{argv[0]}: no rows")
    return rows
