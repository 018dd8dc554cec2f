"""The fake-CUDA lane's C++ library (``fake_cuda.cpp``), built with the system compiler and cached.

Imported by the suite's process (which has imported torch) and by nothing the library must precede: it reads
torch's version and paths from the installed distribution, never from an imported torch.

The library uses torch's private C++ interfaces (ATen's CUDA hooks, c10's device guards), so it is pinned to
:data:`TORCH_BUILD`, the suite's torch build; elsewhere :func:`build_library` raises :class:`LaneUnavailable`
with the reason, and the lane's test skips with it. The cache (``$DISTNERF_FAKE_CUDA_CACHE``, else
``$XDG_CACHE_HOME/distnerf/fake_cuda``, else ``~/.cache/distnerf/fake_cuda``) holds one library per key: the
source, torch's version, the compiler's version and the flags (a change of any builds anew).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

TORCH_BUILD = "2.13.0+cpu"
"""The torch build the C++ was written against (``requirements`` / ``tools/setup_env.sh`` install it)."""
SOURCE = Path(__file__).with_name("fake_cuda.cpp")
BUILD_TIMEOUT_S = 120


class LaneUnavailable(RuntimeError):
    """The lane cannot run here; the message names why (another torch build, no compiler, a failed build)."""


def cache_dir() -> Path:
    """Where built libraries are kept (module docstring)."""
    if os.environ.get("DISTNERF_FAKE_CUDA_CACHE"):
        return Path(os.environ["DISTNERF_FAKE_CUDA_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "distnerf" / "fake_cuda"


def torch_root() -> Path:
    """The installed torch package's folder (its ``include/`` and ``lib/``), found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise LaneUnavailable("torch is not installed")
    return Path(spec.origin).parent


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``, else ``c++``."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise LaneUnavailable("no C++ compiler found ($CXX, g++ or c++ on PATH)")


def _cxx11_abi(root: Path) -> int:
    """torch's ``_GLIBCXX_USE_CXX11_ABI`` (its CMake config records it; 1 for the 2.x wheels on PyPI)."""
    config = root / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    text = config.read_text() if config.is_file() else ""
    return 0 if "_GLIBCXX_USE_CXX11_ABI=0" in text else 1


def build_library() -> Path:
    """The fake-CUDA library for this torch, from the cache or built now (about 5 s with g++).

    Raises:
        LaneUnavailable: torch is not :data:`TORCH_BUILD`, no compiler, or the compiler failed (its last
            lines in the message).
    """
    version = importlib.metadata.version("torch")
    if version != TORCH_BUILD:
        raise LaneUnavailable(f"torch {version} is not the build the fake-CUDA library is pinned to ({TORCH_BUILD}): "
                              f"it uses torch's private C++ interfaces")
    root, cxx = torch_root(), compiler()
    include = root / "include"
    if not (include / "ATen" / "detail" / "CUDAHooksInterface.h").is_file():
        raise LaneUnavailable(f"torch's C++ headers are missing under {include}")
    flags = ["-O1", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi(root)}",
             f"-I{include}", f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu",
             f"-Wl,-rpath,{root / 'lib'}"]
    try:
        cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise LaneUnavailable(f"the C++ compiler {cxx} does not run: {err}") from None
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, cxx_version, *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / f"fake_cuda_{key}.so"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only home): a temporary folder's, kept for the session's runs
        target = Path(tempfile.gettempdir()) / "distnerf_fake_cuda" / target.name
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            done = subprocess.run([cxx, str(SOURCE), "-o", str(built), *flags], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LaneUnavailable(f"building {SOURCE.name} with {cxx} took over {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise LaneUnavailable(f"building {SOURCE.name} with {cxx} failed (exit {done.returncode}):\n{tail}")
        os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target
