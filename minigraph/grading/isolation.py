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
  size, open files, no core files, and one process: the address space limit is per
  process, so the account may not start a second (nor a thread), and ``--memory`` bounds
  the whole sandbox (but for files it writes to memory-backed folders such as /dev/shm,
  and SysV shared memory, until they are removed at the end);
- **a view of its own** (``unshare --mount --ipc``, then ``mount``): /proc shows the
  sandbox its own processes only, so it cannot read the grader's command line, which
  names the submission's path, and an empty folder covers the folder that holds the
  submission and those beside it (a class's, graded one after another); its SysV IPC
  objects and POSIX message queues live in a namespace of its own, gone with it (a queue
  in the machine's passed a message to the next grading under the same account);
- **no way back up**: ``PR_SET_NO_NEW_PRIVS`` (no set-uid program restores privileges)
  and ``PR_SET_PDEATHSIG`` (the sandbox dies with the grader);
- **the end**: as root, a child that takes the account's uid sends ``kill(-1, SIGKILL)``,
  which reaches exactly the processes of that account, whatever their session or parent;
  without root, the grader is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphans
  of the sandbox (a ``setsid`` daemon, a double fork) are re-parented to it instead of
  init, and it kills its descendants until none are left;
- **the leftovers** (as root): the account's SysV IPC objects and its files in every
  folder any account may write into are removed when the grading ends, so that nothing
  passes from one grading to the next.

Without root the sandbox runs as the grader's own user: it cannot be kept from reading
the course or signalling the grader, and :func:`missing_protection` says so in one line.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import pwd
import resource
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Sequence

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
    memory_mb: int = 2048        # address space of the sandbox process
    cpu_seconds: int = 300       # CPU time of the sandbox process
    file_mb: int = 64            # the largest file it may write
    # processes and threads of the account (as root): RLIMIT_AS is per process, so with
    # 32, the sandbox held 32 x --memory; with 1, --memory is the sandbox's
    processes: int = 1
    open_files: int = 256


@dataclass
class Account:
    name: str
    uid: int
    gid: int
    lock_fd: int


def claim_account(shared: Sequence[str] | None = None) -> Account:
    """An unprivileged account no other grading is using now (root only); ``shared``:
    the folders where its files are looked for (default :func:`shared_folders`)."""
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
        end_account(entry.pw_uid, shared)  # leftovers of a grader that was itself killed
        return Account(name, entry.pw_uid, entry.pw_gid, fd)
    raise RuntimeError(f"all {ACCOUNTS} sandbox accounts are in use")


def kill_unclaimed_accounts() -> None:
    """End every sandbox account no grading holds now (:func:`end_account`): what a
    grader that was itself killed left behind (a daemon of the student's that outlived
    it, its files). ``claim_account`` does the same for the account it takes; the runner
    calls this when it had to kill a grader, so that nothing waits for the next grading."""
    if not is_root():
        return
    for n in range(ACCOUNTS):
        name = f"{ACCOUNT_PREFIX}{n}"
        fd = lock_account(name)
        if fd is None:  # held by a grading that is still running
            continue
        try:
            end_account(pwd.getpwnam(name).pw_uid)
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


def end_account(uid: int, shared: Sequence[str] | None = None) -> None:
    """End everything of ``uid`` (root only): its processes, then, as nothing of it runs
    any more, its SysV IPC objects and its files in the folders any account may write
    into (``shared``, default :func:`shared_folders`)."""
    kill_account(uid)
    remove_ipc_of(uid)
    remove_files_of(uid, shared)


def remove_trees(paths: Sequence["str | Path"]) -> None:
    """Remove each of ``paths`` and all that is under it, with coreutils' ``rm -rf``:
    it never follows a link, and walks a tree of any depth (``shutil.rmtree`` recurses
    in Python, once per level: a student's folder 1,500 levels deep raised
    RecursionError in the grader, before the results were written).
    ``--one-file-system``: a file system mounted inside is left alone. ``xargs`` splits
    a long list into commands the kernel accepts. Raises OSError with rm's complaint
    where something could not be removed."""
    if not paths:
        return
    done = subprocess.run(["xargs", "-0", "-r", "rm", "-rf", "--one-file-system", "--"],
                          input=b"\0".join(os.fsencode(p) for p in paths),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        complaint = done.stderr.decode(errors="replace").strip()
        raise OSError(f"rm -rf could not remove everything: {complaint[-500:]}")


@functools.cache
def shared_folders() -> tuple[str, ...]:
    """Every folder of this machine that any account may write into (mode o+w: /tmp,
    /var/tmp, /dev/shm, /run/lock ... whatever this machine has), on every mounted file
    system but the kernel's /proc and /sys, and not below a folder others cannot enter
    (o-x: the account cannot reach what is inside); one inside another is found by
    walking the outer one. A walk of the machine's folders (a second or more), so it is
    done once per process, by the runner, which hands the list to the harness."""
    found = subprocess.run(["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "!",
                            "-perm", "-o+x", ")", "-prune", "-o", "-type", "d", "-perm", "-o+w",
                            "-print0", "-prune"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return tuple(os.fsdecode(p) for p in found.stdout.split(b"\0") if p)


def _closed(info: os.stat_result) -> bool:
    """A folder of root's in which only root, or an entry's owner, may rename an entry
    (not writable by others, or sticky like /tmp). A path through such folders, each
    root's, cannot be turned into a link by another account while root works on it."""
    return info.st_uid == 0 and (not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                                 or bool(info.st_mode & stat.S_ISVTX))


def remove_files_of(uid: int, roots: Sequence[str] | None = None) -> int:
    """Remove every file and folder of ``uid`` under ``roots`` (default
    :func:`shared_folders`) (root only, after the account's processes are ended, so that
    nothing changes meanwhile); return how many. The limit on the size of a file is per
    file: without this, a submission filled /tmp, and /dev/shm (which is memory), with
    files that outlived its grading, and left files in /run/lock for the next grading
    under the same account to read. The walk never follows a link, enters only folders
    the account could enter too, and only root's folders inside closed ones
    (:func:`_closed`): another sandbox, running now, could otherwise swap a folder on
    the path for a link, and make root remove what the link points to. What the account
    left inside another account's folder goes when that folder is removed."""
    targets = []
    stack = []
    for root in shared_folders() if roots is None else roots:
        try:
            above = [os.lstat(folder) for folder in Path(root).parents]
            info = os.lstat(root)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and all(map(_closed, above)):
            stack.append((root, info))
    while stack:
        folder, folder_info = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                targets.append(entry.path)
            elif (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IXOTH
                  and info.st_uid == 0 and _closed(folder_info)):
                stack.append((entry.path, info))
    remove_trees(targets)
    return len(targets)


#: the kinds of SysV IPC object: their table in /proc/sysvipc, and ipcrm's option
IPC_KINDS = (("shm", "-m"), ("msg", "-q"), ("sem", "-s"))


def remove_ipc_of(uid: int) -> int:
    """Remove every SysV shared memory segment, message queue and semaphore set that
    ``uid`` owns or created (root only); return how many. They outlive the processes
    that made them: segments of the account's held memory outside --memory after its
    grading, and any of them could pass data to the next grading under the account.
    (Its owner may give an object away with IPC_SET; the creator stays.)"""
    removed = 0
    for kind, option in IPC_KINDS:
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except OSError:  # (a kernel without SysV IPC)
            continue
        header = lines[0].split()
        ids = []
        for line in lines[1:]:
            fields = dict(zip(header, line.split()))
            if uid in (int(fields["uid"]), int(fields["cuid"])):
                ids.append(fields[header[1]])  # (shmid, msqid, semid)
        if ids:
            done = subprocess.run(["ipcrm"] + [a for i in ids for a in (option, i)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if done.returncode != 0:
                raise OSError(f"ipcrm could not remove the {kind} objects {ids}: "
                              f"{done.stderr.decode(errors='replace').strip()}")
            removed += len(ids)
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
    """Remove others' access to ``path`` (the course folder); True when it changed. A
    symbolic link is left alone: chmod would change what it points to, wherever that is;
    so is a folder others share (:func:`_shared`)."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode) or not mode & stat.S_IRWXO or _shared(path, mode):
        return False
    os.chmod(path, stat.S_IMODE(mode) & ~stat.S_IRWXO)
    return True


def _shared(path: Path, mode: int) -> bool:
    """Whether ``path`` is a folder others share, which must stay open to them: one with
    the sticky bit (/tmp, /var/tmp, /dev/shm), or one holding the temporary folder every
    sandbox works in, or the Python the sandbox runs ("/", "/usr" ...). Two chapters
    unpacked side by side in /tmp made /tmp "the course", and closing it to others locked
    every sandbox out of its own files: every test failed, every student got 0."""
    import sys
    import tempfile

    if mode & stat.S_ISVTX:
        return True
    resolved = path.resolve()
    for needed in (Path(tempfile.gettempdir()), Path(sys.prefix), Path(sys.base_prefix)):
        needed = needed.resolve()
        if resolved == needed or resolved in needed.parents:
            return True
    return False


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


#: what the sandbox's command runs through (as root), in a mount namespace of its own
#: (``unshare --mount``: private propagation, gone with the sandbox) and an IPC namespace
#: of its own (``--ipc``: SysV objects and POSIX message queues): /proc mounted
#: again with ``hidepid=invisible``, so that the account sees only its own processes,
#: and an empty read-only folder mounted over the folder ``$0`` (where not empty) that
#: holds the submission. Without them, the student's code read /proc/PID/cmdline of the
#: grader, found the submission's path, and ran a classmate's exercises.py from the
#: folder beside it.
PRIVATE_VIEW = ('mount -t proc -o hidepid=invisible proc /proc && '
                '{ [ -z "$0" ] || mount -t tmpfs -o ro,size=4k,mode=0555 hidden "$0"; } && '
                'exec "$@"')


def _view(hide: "str | Path") -> tuple[str, ...]:
    return ("unshare", "--mount", "--ipc", "--", "sh", "-c", PRIVATE_VIEW, str(hide))


@functools.cache
def can_make_private_view() -> bool:
    """Whether this machine lets the grader run the sandbox in :data:`PRIVATE_VIEW`
    (root, and a kernel or container that lets root make a mount namespace and mount
    there); tried once per process. Where not, :func:`missing_protection` says so."""
    if not is_root():
        return False
    folder = private_dir("minigraph-view-")
    try:
        tried = subprocess.run(_view(folder) + ("true",), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        folder.rmdir()
    return tried.returncode == 0


def private_view(hide: Path | None) -> tuple[str, ...]:
    """The command to put before the sandbox's: :data:`PRIVATE_VIEW`, covering ``hide``
    (see :func:`folder_to_hide`), where this machine allows it, else ``()``."""
    return _view(hide or "") if can_make_private_view() else ()


def folder_to_hide(submission: Path, needed: Sequence[Path]) -> Path | None:
    """The highest folder that holds ``submission`` (a folder, resolved) and none of
    ``needed`` (what the sandbox reads: its own folder, Python, minigraph), but none
    directly under /: the submissions of a class, side by side there, are then out of
    the sandbox's sight whatever their modes. None where ``submission`` holds one."""
    needed = [n.resolve() for n in needed]
    hide = None
    for folder in [submission, *submission.parents]:
        if len(folder.parts) < 3 or any(folder == n or folder in n.parents for n in needed):
            break
        hide = folder
    return hide


def missing_protection() -> str | None:
    if is_root():
        if can_make_private_view():
            return None
        return ("sandbox: this machine does not let the grader give the sandbox a view of "
                "its own (unshare --mount --ipc, then mount), so the student's code can read the "
                "grader's command line, and the submission's path in it, and the folders "
                "beside the submission: keep other submissions where others cannot read them")
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
        remove_trees([path])
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
