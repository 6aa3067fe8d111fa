"""Writing a file whole or not at all, as ``mg.save`` and ``Profile.to_chrome_trace`` do.

A file written in place and interrupted half-way (a full disk, Ctrl-C, an error while its
content is made) is lost: the old content is gone, the new one incomplete. So the content
goes to a new file beside the target, is flushed to the disk, and then replaces the target
in one step (``os.replace``, atomic on POSIX and Windows). Apart from that, the write
behaves as ``open(path, "wb")`` does, which is what a user of ``np.save`` or ``torch.save``
expects: a link at ``path`` is written through (its target changes, the link stays), a new
file gets the mode ``open`` gives (0o666 less the umask), a replaced one keeps its mode, and
an error names ``path``, not the temporary file. What cannot be replaced whole is written
in place, as ``open`` writes it: a FIFO, a device (``/dev/stdout``), a file with other
hard links (replacing it would leave the other names with the old content).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import IO, Callable


def write_atomically(path: "str | os.PathLike[str]", write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` through ``write(f)``, ``f`` a binary file: whole, or not at all."""
    given = os.fspath(path)
    if not given:  # (realpath("") is the current folder)
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), given)
    if os.path.isdir(given) or given.endswith(("/", os.sep)):  # (realpath drops a "/")
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), given)
    try:
        status = os.stat(given)  # (through links, as open follows them: /dev/stdout too)
    except FileNotFoundError:
        status = None
    if status is not None and (not stat.S_ISREG(status.st_mode) or status.st_nlink > 1):
        with open(given, "wb") as f:  # (a pipe, a device, a hard link: in place)
            write(f)
        return
    target = os.path.realpath(given)  # (replacing a link itself would leave its file as it was)
    folder, name = os.path.split(target)
    try:
        fd, temporary = _new_file(folder, name)
    except OSError as exc:  # (no such folder, no permission: what open(path) would say)
        raise type(exc)(exc.errno, exc.strerror, given) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):  # (a new file has open()'s mode already: _new_file)
            os.chmod(temporary, os.stat(target).st_mode & 0o777)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _new_file(folder: str, name: str) -> tuple[int, str]:
    """A new temporary file in ``folder``, opened for writing: ``(fd, path)``. As
    ``tempfile.mkstemp`` makes one (a random name, created only if it does not exist:
    O_EXCL), but with the mode ``open()`` gives a new file, 0o666 less the umask, which
    the system applies itself (mkstemp's file is its owner's only)."""
    while True:
        temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:  # (2**64 names: another run's, once in an age)
            continue
