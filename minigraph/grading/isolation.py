"""Who the sandbox runs as, what it may use, and how every process it started is ended.

All of it is the operating system's own machinery, applied in the child between ``fork``
and ``exec`` (``subprocess.Popen``'s ``user``, ``group``, ``extra_groups`` and
``preexec_fn``):

- **an account** (as root): a system account ``minigraph-sbN`` without a home or a login
  shell, created with ``useradd --system`` when missing. One account per concurrent
  grading, claimed with a lock file, so that ending "every process of the account" never
  touches another grading. The account cannot read the course (the grader removes
  others' access to the course folder), cannot write where results go (the grader's
  private folder, mode 0700), cannot write the installed package (owned by root);
- **limits** (``resource.setrlimit``): CPU seconds, address space (``--memory``), file
  size, open files, number of processes, no core files;
- **no way back up**: ``PR_SET_NO_NEW_PRIVS`` (no set-uid program restores privileges)
  and ``PR_SET_PDEATHSIG`` (the sandbox dies with the grader);
- **the end**: as root, a child that takes the account's uid sends ``kill(-1, SIGKILL)``,
  which reaches exactly the processes of that account, whatever their session or parent;
  without root, the grader is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphans
  of the sandbox (a ``setsid`` daemon, a double fork) are re-parented to it instead of
  init, and it kills its descendants until none are left.

Without root the sandbox runs as the grader's own user: it cannot be kept from reading
the course or signalling the grader, and :func:`missing_protection` says so in one line.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
ACCOUNT_PREFIX = "minigraph-sb"
ACCOUNTS = 16
LOCK_DIR = Path("/tmp/.minigraph-sandbox-locks")

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> bool:
    return _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) == 0


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class Limits:
    memory_mb: int = 2048        # address space of each sandbox process
    cpu_seconds: int = 300       # CPU time of each sandbox process
    file_mb: int = 64            # the largest file it may write
    processes: int = 32          # processes and threads of the account (as root)
    open_files: int = 256


@dataclass
class Account:
    name: str
    uid: int
    gid: int
    lock_fd: int


def claim_account() -> Account:
    """An unprivileged account no other grading is using now (root only)."""
    for n in range(ACCOUNTS):
        name = f"{ACCOUNT_PREFIX}{n}"
        fd = lock_account(name)
        if fd is None:
            continue
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", "--user-group", name],
                           check=True, capture_output=True)
            entry = pwd.getpwnam(name)
        kill_account(entry.pw_uid)  # leftovers of a grader that was itself killed
        return Account(name, entry.pw_uid, entry.pw_gid, fd)
    raise RuntimeError(f"all {ACCOUNTS} sandbox accounts are in use")


def kill_unclaimed_accounts() -> None:
    """End the processes of every sandbox account no grading holds now: what a grader
    that was itself killed left behind (a daemon of the student's that outlived it).
    ``claim_account`` does the same for the account it takes; the runner calls this
    when it had to kill a grader, so that nothing waits for the next grading."""
    if not is_root():
        return
    for n in range(ACCOUNTS):
        name = f"{ACCOUNT_PREFIX}{n}"
        fd = lock_account(name)
        if fd is None:  # held by a grading that is still running
            continue
        try:
            kill_account(pwd.getpwnam(name).pw_uid)
        except KeyError:  # (never created)
            pass
        finally:
            os.close(fd)


def lock_account(name: str) -> int | None:
    """The open lock file of account ``name``, locked for this process; None where
    another grading holds it now. Closing the file releases it."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(LOCK_DIR / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release_account(account: Account) -> None:
    os.close(account.lock_fd)


def limit_child(limits: Limits, extra_processes: int) -> None:
    """Runs in the sandbox between fork and exec (after the switch of account)."""
    os.umask(0o077)
    mb = 1024 * 1024
    for which, value in ((resource.RLIMIT_AS, limits.memory_mb * mb),
                         (resource.RLIMIT_CPU, limits.cpu_seconds),
                         (resource.RLIMIT_FSIZE, limits.file_mb * mb),
                         (resource.RLIMIT_NOFILE, limits.open_files),
                         (resource.RLIMIT_NPROC, limits.processes + extra_processes),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def processes_of_user(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def kill_account(uid: int, patience: float = 5.0) -> int:
    """SIGKILL every process of ``uid`` (root only); return how many were left after."""
    deadline = time.monotonic() + patience
    while True:
        pid = os.fork()
        if pid == 0:  # the child takes the account's uid: kill(-1) reaches its processes only
            try:
                os.setgroups([])
                os.setgid(pwd.getpwuid(uid).pw_gid)
                os.setuid(uid)
                for _ in range(50):
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except ProcessLookupError:
                        break
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        reap_orphans()
        left = processes_of_user(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


#: where any account may write: what the sandbox's account left there is removed
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def remove_files_of(uid: int, roots: tuple[str, ...] = SHARED_FOLDERS) -> int:
    """Remove every file and folder of ``uid`` under ``roots`` (root only, after the
    account's processes are ended, so that nothing changes meanwhile); return how many.
    The limit on the size of a file is per file: without this, a submission filled
    /tmp, and /dev/shm (which is memory), with files that outlived its grading. The walk
    never follows a link, and enters only folders the account could enter too."""
    removed = 0
    stack = [root for root in roots if os.path.isdir(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)  # (never follows links)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        continue
                removed += 1
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IXOTH:
                stack.append(entry.path)
    return removed


def reap_orphans() -> None:
    """Collect the exit status of dead children (orphans re-parented to this subreaper),
    so that they stop counting as processes of the account."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def kill_descendants(exclude: AbstractSet[int] = frozenset(), patience: float = 5.0) -> int:
    """SIGKILL every descendant of this process (a subreaper: orphans come back to it)."""
    deadline = time.monotonic() + patience
    me = os.getpid()
    while True:
        stack, seen = [me], []
        while stack:
            for child in _children(stack.pop()):
                if child not in exclude:
                    seen.append(child)
                    stack.append(child)
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_orphans()
        if not seen or time.monotonic() > deadline:
            return len(seen)
        time.sleep(0.01)


def readable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH))


def close_to_others(path: Path) -> bool:
    """Remove others' access to ``path`` (the course folder); True when it changed."""
    mode = path.stat().st_mode
    if not mode & stat.S_IRWXO:
        return False
    os.chmod(path, stat.S_IMODE(mode) & ~stat.S_IRWXO)
    return True


def private_dir(prefix: str) -> Path:
    import tempfile
    return Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700, owned by the grader


def sandbox_dir(parent: Path, account: Account | None) -> Path:
    """The sandbox's working folder: the only place it may write."""
    folder = parent / "sandbox"
    folder.mkdir(mode=0o700)
    if account is not None:
        os.chown(folder, account.uid, account.gid)
        os.chmod(parent, 0o711)  # the account may pass through, not list or write
    return folder


def missing_protection() -> str | None:
    if is_root():
        return None
    return ("sandbox: not running as root, so the student's code runs as your own user: it "
            "is separated into its own process with limits, but could read the course's files "
            "and signal the grader (grade as root, as Gradescope does, for the full protection)")


def new_file(path: "str | Path", flags: int) -> int:
    """A new regular file at ``path``, opened with ``flags``: whatever held the name (a
    file, a symlink, a FIFO, a folder an earlier sandbox left) is removed first, and the
    file is made without following a link (``O_EXCL | O_NOFOLLOW``)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def copy_for_sandbox(source: Path, folder: Path, account: Account | None,
                     name: str = "exercises.py") -> Path:
    """A copy of ``source`` in the sandbox's ``folder``, the account's, named ``name``
    (what the sandbox imports, whatever the student's file is called). The grader runs
    as root, and an earlier sandbox may have put a symlink (or a hard link) where the copy
    goes: copying through it would let the student's code write, and own, any file. So
    the old name is removed and the copy made new, never following a link, and given to
    the account through its descriptor. The source is read without following a link
    either, and must be a regular file: a submission's exercises.py that links to the
    course's reference solution would otherwise be read, as root, and run as the
    student's."""
    try:
        source_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:  # ELOOP: a symlink
        raise OSError(f"{source} cannot be read without following a link: {exc.strerror}") \
            from None
    with os.fdopen(source_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):  # (a FIFO, a device ...)
            raise OSError(f"{source} is not a regular file")
        data = src.read()
    target = folder / name
    fd = new_file(target, os.O_WRONLY)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        if account is not None:
            os.fchown(out.fileno(), account.uid, account.gid)
    return target
