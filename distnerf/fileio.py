"""File writes that never leave a torn file under a final name, and a lock that never hangs.

Used by checkpoints (:mod:`distnerf.checkpoint`), the pixel cache and the built-in scenes'
cache (:func:`exclusive_lock`), and every JSON/HTML report (:func:`atomic_write_text`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger("distnerf")


class CheckpointWriteError(RuntimeError):
    """A file could not be written (disk full, a file-size limit, permissions): the message names
    the file and the cause; nothing partial is left under the file's name."""


def _write_failed(path: Path, tmp: Path, err: BaseException) -> CheckpointWriteError:
    tmp.unlink(missing_ok=True)  # the partial file goes: nothing torn stays beside the real ones
    text = str(err).strip()
    cause = getattr(err, "strerror", None) or (text.splitlines()[0] if text else type(err).__name__)
    return CheckpointWriteError(f"could not write {path}: {cause}")


class _RecordingWriter:
    """A file's ``write`` that keeps the OS error of a failed write (EFBIG, ENOSPC), which
    ``torch.save`` would otherwise report only as a position mismatch."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data):
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self):
        return self.f.flush()


def atomic_torch_save(obj, path: Path) -> None:
    """``torch.save`` to ``path.tmp`` then rename (no partial file under ``path``).

    Raises:
        CheckpointWriteError: the write failed (names ``path`` and the cause; the temp file is removed).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    out = None
    try:
        with open(tmp, "wb") as f:
            out = _RecordingWriter(f)
            torch.save(obj, out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch's writer turns a failed write into a RuntimeError ("unexpected
        raise _write_failed(path, tmp, out.error if out is not None and out.error else err) from err  # pos"): the OS's


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` into ``path.tmp``, fsync, rename. Raises CheckpointWriteError as :func:`atomic_torch_save`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise _write_failed(path, tmp, err) from err


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, what: str = "the pixel cache", log_every_s: float = 60.0):
    """Hold an exclusive ``flock`` on ``lock_path`` while building ``what`` once for every
    process sharing a directory (ranks of one host, later runs). The kernel releases the
    lock when its holder dies, so a waiter then goes on (no hang). Waiting is logged
    every ``log_every_s`` seconds after the first 5."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        next_log = time.monotonic() + 5.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > next_log:
                    log.info("waiting for another process to finish %s (lock %s)", what, lock_path)
                    next_log += log_every_s
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock
