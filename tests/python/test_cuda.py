"""remat.install_cuda_allocator() and REMAT_DEVICE=cuda (integration/python/remat/cuda.py), against the real
libremat_cuda.so. Our machines have no GPU: there, installing must fail with a clear RuntimeError and leave torch
untouched. On a machine with a GPU the same tests check that installation works instead (never run by us).

Scenarios that could install an allocator or depend on a fresh interpreter run in a subprocess."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import remat
import remat.cuda

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = torch.cuda.device_count() > 0  # asks the driver; does not initialize torch's CUDA state


def run_python(code: str, **env_overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for name in ("REMAT_BUDGET", "REMAT_DEVICE", "REMAT_POLICY", "REMAT_HOST_BUDGET", "REMAT_TRACE",
                 "REMAT_CUDA_LIBRARY"):
        env.pop(name, None)
    env.update(env_overrides)
    env["PYTHONPATH"] = str(ROOT / "integration" / "python")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_the_cuda_library_is_built_when_nvcc_is_present():
    if shutil.which("nvcc") is None:
        with pytest.raises(RuntimeError, match="libremat_cuda.so was not built"):
            remat.cuda.cuda_library_path()
    else:
        path = remat.cuda.cuda_library_path()
        assert path.name == "libremat_cuda.so"
        # The one next to the libremat_torch.so this process loaded (same build).
        assert path.resolve().parent == remat.library_path().resolve().parent / "cuda"


def test_exported_from_the_package():
    assert remat.install_cuda_allocator is remat.cuda.install_cuda_allocator
    assert "install_cuda_allocator" in remat.__all__


def test_install_without_a_gpu_fails_clearly_and_leaves_torch_alone():
    code = (
        "import torch, remat\n"
        "try:\n"
        "    info = remat.install_cuda_allocator(budget='64MiB', policy='dtr-eq')\n"
        "except RuntimeError as error:\n"
        "    print('ERROR', error)\n"
        "else:\n"
        "    x = torch.ones(1024, device='cuda')\n"
        "    print('INSTALLED', info.budget, info.policy, torch.cuda.memory_reserved(), torch.cuda.memory_allocated())\n"
        "print('BACKEND', torch.cuda.get_allocator_backend())\n"
        "print('INITIALIZED', torch.cuda.is_initialized())\n"
        "print('RECORDED', remat.cuda.installed_cuda_allocator())\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    if HAS_GPU:  # never run by us
        assert f"INSTALLED 64MiB dtr-eq {64 << 20} 4096" in out
        assert "BACKEND remat" in out
    else:
        assert "ERROR remat: no CUDA device is available, so remat's CUDA allocator cannot be installed" in out
        assert "needs an NVIDIA GPU" in out
        assert "BACKEND native" in out       # nothing was installed
        assert "INITIALIZED False" in out    # and CUDA was not initialized by trying
        assert "RECORDED None" in out


def test_install_after_cuda_was_initialized_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is already initialized in this process"):
        remat.install_cuda_allocator(budget="1GiB")
    assert remat.cuda.installed_cuda_allocator() is None


def test_missing_library_says_it_was_not_built(monkeypatch, tmp_path):
    monkeypatch.delenv("REMAT_CUDA_LIBRARY", raising=False)
    monkeypatch.setattr(remat.cuda, "_library", None)
    monkeypatch.setattr(remat.cuda, "_candidate_paths", lambda: [tmp_path / "libremat_cuda.so"])
    with pytest.raises(RuntimeError, match=r"libremat_cuda.so was not built .*nvcc") as info:
        remat.install_cuda_allocator(budget="1GiB")
    assert str(tmp_path) in str(info.value)  # says where it looked
    monkeypatch.setenv("REMAT_CUDA_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(RuntimeError, match="REMAT_CUDA_LIBRARY=.*does not name a file"):
        remat.install_cuda_allocator(budget="1GiB")


def test_malformed_budgets_and_policies_are_value_errors(monkeypatch):
    monkeypatch.delenv("REMAT_BUDGET", raising=False)
    monkeypatch.delenv("REMAT_POLICY", raising=False)
    with pytest.raises(ValueError, match='malformed byte size "lots"'):
        remat.install_cuda_allocator(budget="lots")
    with pytest.raises(ValueError, match=r"outside \(0, 1\]"):
        remat.install_cuda_allocator(budget="1.5")
    with pytest.raises(ValueError, match=r"fraction of device memory must be in \(0, 1\]"):
        remat.install_cuda_allocator(budget=2.0)
    with pytest.raises(ValueError, match="must be > 0 bytes"):
        remat.install_cuda_allocator(budget=0)
    with pytest.raises(ValueError, match='"many"'):
        remat.install_cuda_allocator(budget="1GiB", host_budget="many")
    with pytest.raises(ValueError, match="unknown policy 'nope'; registered policies: .*dtr-eq"):
        remat.install_cuda_allocator(budget="1GiB", policy="nope")
    with pytest.raises(ValueError, match="unknown arena 'stiched'; expected contiguous, stitch or stitch:SIZE"):
        remat.install_cuda_allocator(budget="1GiB", arena="stiched")
    with pytest.raises(ValueError, match="arena 'stitch:3MiB': the granule must be a power of two"):
        remat.install_cuda_allocator(budget="1GiB", arena="stitch:3MiB")
    monkeypatch.setenv("REMAT_ARENA", "paged")
    with pytest.raises(ValueError, match="unknown REMAT_ARENA 'paged'"):
        remat.install_cuda_allocator(budget="1GiB")
    monkeypatch.delenv("REMAT_ARENA")
    with pytest.raises(ValueError, match="set REMAT_BUDGET"):
        remat.install_cuda_allocator()
    monkeypatch.setenv("REMAT_BUDGET", "6 bananas")
    with pytest.raises(ValueError, match='REMAT_BUDGET="6 bananas" is not valid'):
        remat.install_cuda_allocator()
    assert remat.cuda.installed_cuda_allocator() is None
    assert torch.cuda.get_allocator_backend() == "native"


def test_engine_arguments_are_checked_before_anything_is_installed(monkeypatch):
    monkeypatch.delenv("REMAT_POLICY", raising=False)
    with pytest.raises(ValueError, match="unknown costs 'cheap'; expected one of measured, estimated"):
        remat.install_cuda_allocator(budget="1GiB", costs="cheap")
    with pytest.raises(ValueError, match="offload"):
        remat.install_cuda_allocator(budget="1GiB", offload="sideways")
    with remat.enable(budget="16MiB"):
        with pytest.raises(RuntimeError, match=r"remat is already enabled \(on the CPU\); call remat.disable\(\)"):
            remat.install_cuda_allocator(budget="1GiB")
    assert remat.cuda.installed_cuda_allocator() is None
    assert torch.cuda.get_allocator_backend() == "native"


@pytest.mark.parametrize("devices, message", [
    ("some", r"devices must be None \(the current device\), a device index, a list of them or 'all', got 'some'"),
    ([], r"a non-empty list of them or 'all', got \[\]"),
    (1.5, r"a non-empty list of them or 'all', got 1.5"),
    (True, r"got True"),
    ([0, "1"], r"a device is an index \(int\), got '1' in devices=\[0, '1'\]"),
    (-1, r"device -1 is not valid: a device index is >= 0"),
    ([1, 0, 1], r"devices lists a device twice: \[1, 0, 1\]"),
])
def test_devices_are_checked_before_anything_is_installed(devices, message):
    with pytest.raises(ValueError, match=message):
        remat.install_cuda_allocator(budget="1GiB", devices=devices)
    assert remat.cuda.installed_cuda_allocator() is None
    assert torch.cuda.get_allocator_backend() == "native"
    assert not torch.cuda.is_initialized()


def test_devices_out_of_range_or_without_the_engine_are_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # what a two-GPU machine's driver reports
    with pytest.raises(ValueError, match=r"device 2 is out of range: this machine has 2 CUDA device\(s\)"):
        remat.install_cuda_allocator(budget="1GiB", devices=[0, 2])
    with pytest.raises(ValueError, match="devices chooses where the engine runs; with engine=False it runs nowhere"):
        remat.install_cuda_allocator(budget="1GiB", devices=1, engine=False)
    with pytest.raises(ValueError, match=r"budget must be bytes \(int\), a fraction"):  # one budget, for each device
        remat.install_cuda_allocator(budget={0: "1GiB", 1: "2GiB"}, devices="all")
    assert remat.cuda.installed_cuda_allocator() is None
    assert torch.cuda.get_allocator_backend() == "native"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (never run by us)")
def test_the_engine_on_every_device_with_a_copy_between_them():
    code = (
        "import torch, remat\n"
        "info = remat.install_cuda_allocator(budget='256MiB', devices='all')\n"
        "print('DEVICES', info.devices)\n"
        "x = [torch.randn(1024, 1024, device=f'cuda:{d}') for d in info.devices]\n"
        "y = [torch.tanh(torch.sin(t) * 1.5) for t in x]\n"
        "moved = y[0].to('cuda:1')\n"
        "print('COPY', moved.cpu().numpy().tobytes() == y[0].cpu().numpy().tobytes())\n"
        "s = remat.stats()\n"
        "print('STATS', int(s['devices']), all(f'device{d}_tracked_ops' in s for d in info.devices))\n"
        "remat.disable()\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    count = torch.cuda.device_count()
    assert f"DEVICES {tuple(range(count))}" in result.stdout
    assert "COPY True" in result.stdout
    assert f"STATS {count} True" in result.stdout


@pytest.mark.parametrize("value, expected", [("", "cpu"), ("cpu", "cpu"), (" CUDA ", "cuda")])
def test_remat_device_values(monkeypatch, value, expected):
    monkeypatch.setenv("REMAT_DEVICE", value)
    assert remat.cuda.device_from_environment() == expected


def test_import_with_a_bad_remat_device_names_the_variable():
    result = run_python("import remat", REMAT_DEVICE="gpu")
    assert result.returncode != 0
    assert "ImportError: remat: REMAT_DEVICE='gpu' is not valid: expected one of cpu, cuda" in result.stderr


def test_import_with_remat_device_cuda_needs_a_budget():
    result = run_python("import remat", REMAT_DEVICE="cuda")
    assert result.returncode != 0
    assert "ImportError: remat: REMAT_DEVICE=cuda needs REMAT_BUDGET" in result.stderr


def test_import_with_remat_device_cuda_and_a_malformed_budget_names_the_variable():
    result = run_python("import remat", REMAT_DEVICE="cuda", REMAT_BUDGET="lots")
    assert result.returncode != 0
    assert 'REMAT_BUDGET="lots" is not valid' in result.stderr


def test_import_with_remat_device_cuda_installs_or_fails_clearly():
    code = "import torch, remat\nprint('BACKEND', torch.cuda.get_allocator_backend(), remat.cuda.installed_cuda_allocator())\n"
    result = run_python(code, REMAT_DEVICE="cuda", REMAT_BUDGET="0.5")
    if HAS_GPU:  # never run by us
        assert result.returncode == 0, result.stderr
        assert "BACKEND remat" in result.stdout
    else:
        assert result.returncode != 0
        assert "ImportError: remat: REMAT_DEVICE=cuda: remat: no CUDA device is available" in result.stderr


def test_import_with_remat_device_cpu_installs_nothing():
    result = run_python("import torch, remat\nprint(remat.cuda.installed_cuda_allocator(), "
                        "torch.cuda.get_allocator_backend())", REMAT_DEVICE="cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None native"


def run_example(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REMAT_BUDGET", "REMAT_DEVICE")}
    env["PYTHONPATH"] = str(ROOT / "integration" / "python")
    return subprocess.run([sys.executable, str(ROOT / "examples" / "train_cuda.py"), *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("allocator", ["remat", "torch"])
def test_train_cuda_example_says_it_was_not_run_on_a_gpu_and_fails_clearly_without_one(allocator):
    args = ["--budget", "0.5", "--steps", "1", "--batch-size", "2", "--image-size", "64"]
    result = run_example(*args, *(["--no-remat"] if allocator == "torch" else []))
    assert "has not been run on a GPU by us" in result.stdout
    if HAS_GPU:  # never run by us
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"allocator: {'remat' if allocator == 'remat' else 'native'}" in result.stdout
        assert "done" in result.stdout
    else:
        assert result.returncode == 2, result.stdout + result.stderr
        if allocator == "remat":
            assert ("train_cuda.py: cannot install remat's CUDA allocator: remat: no CUDA device is available"
                    in result.stderr)
        else:
            assert "train_cuda.py: no CUDA GPU is available" in result.stderr
        assert "Traceback" not in result.stderr


def test_train_cuda_example_reports_a_bad_budget_before_touching_cuda():
    result = run_example("--budget", "lots")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train_cuda.py: cannot install remat's CUDA allocator: " in result.stderr
    assert 'malformed byte size "lots"' in result.stderr


def test_the_paging_benchmark_against_save_on_cpu_says_it_was_not_run_on_a_gpu_and_fails_clearly_without_one():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "cuda_paging_vs_save_on_cpu.py"), "--steps", "2",
                             "--batch-size", "2", "--image-size", "64"],
                            capture_output=True, text=True, timeout=1800)
    assert "has not been run on a GPU by us" in result.stdout
    if HAS_GPU:  # never run by us
        assert result.returncode == 0, result.stdout + result.stderr
        assert "| torch + save_on_cpu |" in result.stdout
        assert "| remat, offload auto at save_on_cpu's peak |" in result.stdout
    else:
        assert result.returncode == 2, result.stdout + result.stderr
        assert "no CUDA GPU is available" in result.stderr
        assert "Traceback" not in result.stderr
