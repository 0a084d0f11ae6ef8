"""Files memagent reads and writes, opened with care: only regular files of a bounded size
are read (a FIFO would block forever, /dev/zero never ends); what it writes holds the
document's words, so files it creates are private (0600, in 0700 folders it creates, whatever
the umask) and a file two processes would append to is locked; an append-only log's last
line a crash may have cut is dropped.

Where the file system refuses chmod (WSL2 on /mnt/c answers EPERM), files are written all
the same and stderr says once that their permissions could not be restricted. Locks are
flock on POSIX and msvcrt.locking on Windows; a Python with neither has no locks, and two
writers of one file are then not refused (docs/install.md's table says where).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeVar

from memagent_cli.errors import ModelError, UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None  # type: ignore[assignment]

MAX_LINE_BYTES = 16 << 20  # longer than any record memagent writes
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700
# Windows' locks are mandatory: a locked byte cannot be read by others. This one is far past
# the end of any file memagent writes, so readers (`trace --follow`) still read it all.
_LOCKED_BYTE = 1 << 40
_unrestricted: list[str] = []  # folders where chmod was refused, said once each
# What the library has to say that is not an error: the command prints it on stderr
# (views/console.py show_notes); a Python caller's logging configuration decides.
NOTES = logging.getLogger("memagent")
# The engine's notes (backends/: its calibration, drafts it cannot use), shown as they always
# were: "memagent: " and the sentence, where the others say "memagent: note: ".
ENGINE_NOTES = NOTES.getChild("engine")
T = TypeVar("T")
_FLAGS = {
    "w": os.O_WRONLY | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_APPEND,
    "a+": os.O_RDWR | os.O_APPEND,
    "x": os.O_WRONLY,
}


def private_folder(path: Path) -> None:
    """Make the folder `path` and any missing parent, each 0700 whatever the umask (a
    folder memagent makes holds traces, results or extracted text); folders that are there
    keep their mode. OSError as from Path.mkdir when one cannot be made."""
    missing = []
    folder = path
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, PRIVATE_FOLDER)
        except FileExistsError:  # made meanwhile by another memagent
            continue
        # A umask such as 0o277 takes the owner's bits too.
        _restrict(os.chmod, made, PRIVATE_FOLDER, made)
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, "a file stands where a folder should be", str(path))


def open_private(
    path: Path, mode: str = "w", *, encoding: str = "utf-8", errors: str = "strict"
) -> IO[str]:
    """`path` opened as text for `mode` ("w", "a", "a+" or "x"); a file it creates is 0600
    whatever the umask, a file that is there keeps its mode. Folders are not made."""
    flags = _FLAGS[mode] | getattr(os, "O_CLOEXEC", 0)
    try:
        handle = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        created = True
    except FileExistsError:
        if mode == "x":
            raise
        # Without waiting: opening a FIFO to write waits for a reader forever (with none,
        # O_NONBLOCK makes it ENXIO). Only the open; writes then wait as ever.
        handle = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
        created = False
    try:
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(handle, True)
        if created and hasattr(os, "fchmod"):
            _restrict(os.fchmod, handle, PRIVATE_FILE, Path(path).parent)
        return os.fdopen(handle, "w" if mode == "x" else mode, encoding=encoding, errors=errors)
    except BaseException:
        os.close(handle)
        raise


def _restrict(chmod: Callable[[Any, int], None], target: Any, mode: int, folder: Path) -> None:
    """`chmod(target, mode)`; where the file system refuses it (EPERM on WSL2's /mnt/c,
    ENOTSUP), go on and say once per folder (NOTES) that the permissions are the file
    system's."""
    try:
        chmod(target, mode)
    except OSError as exc:
        if exc.errno != errno.EPERM and not _unsupported(exc):
            raise
        if str(folder) not in _unrestricted:
            _unrestricted.append(str(folder))
            NOTES.info(
                f"could not restrict the permissions of files in {folder} (chmod: "
                f"{exc.strerror or exc}); they have the file system's own, which may let other "
                "users read them."
            )


def _unsupported(exc: OSError) -> bool:
    """Whether `exc` says the file system lacks the operation. By name, never by number:
    ENOTSUP is 45 on macOS and 95 on Linux (where it equals EOPNOTSUPP, 102 on macOS)."""
    return exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def lock(file: IO[str] | BinaryIO, *, wait: bool = False) -> bool:
    """Take the lock of an open file for this process, without waiting: False when another
    process (or, on Windows, another open file) holds it, as when it is writing the file.
    With `wait`, for a lock held only while a small file is rewritten, wait for it (False
    only where Windows gave up after its 10 s). Closing the file lets the lock go."""
    fd = file.fileno()
    if fcntl is None:
        return _lock_windows(fd, wait) if msvcrt is not None else True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as exc:  # a file system without locks (some network mounts): no lock
        if exc.errno == errno.ENOLCK or _unsupported(exc):
            return True
        raise
    return True


def _lock_windows(fd: int, wait: bool) -> bool:
    """msvcrt's lock of one byte past the end of any file memagent writes: locking takes
    the byte range at the file's position, which is put back. LK_LOCK tries for 10 s."""
    where = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, _LOCKED_BYTE, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
    except OSError:  # held by another: EACCES or EDEADLOCK, as Windows says it
        return False
    finally:
        os.lseek(fd, where, os.SEEK_SET)
    return True


def read_kept(
    path: Path, limit: int, parse: Callable[[bytes], T], what: str, note: Any = None
) -> T | None:
    """`parse` of a small file memagent keeps in its data folder (a calibration, a kept
    speed), or None: none kept, or one that is not sound. Read only as a regular file of at
    most `limit` bytes, not through a link in its place (a FIFO or /dev/zero there cannot
    stall it); `parse` raises ValueError with why it is not one. `note` hears why, in one
    line, naming it (`what`), and that it is measured again."""
    try:
        return parse(read_checked(path, limit, follow=False))
    except (FileNotFoundError, NotADirectoryError):  # not kept yet
        return None
    except (OSError, ValueError) as exc:
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        if note is not None:
            note(f"{what} {path} cannot be used ({why}): measuring again")
        return None


def replace_private(path: Path, text: str, prefix: str) -> None:
    """Write `text` to `path` whole or not at all: into a private temporary file named
    `prefix`..., in `path`'s folder, then renamed over `path` (readers see the old file or
    the new one, never half of one). The temporary file is gone when this returns or
    raises, Ctrl-C included; OSError (and ValueError: text that cannot be encoded) as from
    the write."""
    temp = path.with_name(f"{prefix}{os.getpid()}-{time.monotonic_ns()}.tmp")
    try:
        with open_private(temp, "x") as file:  # 0600
            file.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def remove_stale(folder: Path, prefix: str, age: float = 3600.0, suffix: str = "") -> None:
    """Remove the temporary files of replace_private(..., `prefix`) that a kill or a full
    disk cut short (names starting with `prefix` and ending with `suffix`), once older than
    `age` seconds (a write takes a moment: one that old is no other process's write in
    flight)."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(prefix) and entry.name.endswith(suffix):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > age:
                        os.unlink(entry.path)


def sync(file: IO[str] | BinaryIO) -> None:
    """Flush `file` to the disk itself: on macOS fsync reaches only the drive's cache, and
    F_FULLFSYNC (where the file system has it) is what makes a record survive a power loss."""
    file.flush()
    fd = file.fileno()
    if fcntl is not None and hasattr(fcntl, "F_FULLFSYNC"):
        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
        except OSError:  # a file system without it (some network mounts): fsync
            pass
    os.fsync(fd)


def close_and_remove(file: IO[str] | BinaryIO, path: Path) -> None:
    """Remove `path`, which `file` holds open (and locked), then close it. Where an open file
    cannot be removed (Windows), it is closed first, then removed; a file that cannot be
    removed at all stays."""
    try:
        os.unlink(path)
    except PermissionError:
        file.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    except OSError:
        pass
    file.close()


def cannot_write(path: Path, exc: OSError) -> str:
    """Why `path` cannot be written, in words: "Permission denied", for ENOTDIR and a
    file in a folder's place "a file stands where a folder should be", or for a link to
    nothing (whose file open_private neither creates nor finds) that it is one."""
    if isinstance(exc, (FileExistsError, FileNotFoundError)) and _dangling(path):
        return "it is a link to a file that does not exist"
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "a file stands where a folder should be"
    return exc.strerror or type(exc).__name__


def _dangling(path: Path) -> bool:
    try:
        return os.path.islink(path) and not os.path.lexists(os.path.realpath(path))
    except (OSError, ValueError):
        return False


def check_folder(folder: Path, what: str, error: type[UserError] = UserError) -> None:
    """Fail with one sentence, before any long work, unless files can be created in
    `folder` (made if missing, 0700): the only sure test is to try (permissions, read-only
    mounts, /proc, a file where a folder should be)."""
    try:
        private_folder(folder)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise error(f"Cannot write {what} in {folder}: {cannot_write(folder, exc)}.") from None


class NotRegular(OSError):
    """A path that is there but is no regular file (a FIFO, a device, a folder)."""


class TooLarge(OSError):
    """A regular file over the size its reader allows."""

    def __init__(self, path: Path, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"it is over {limit:,} bytes", str(path))
        self.size = size


def open_checked(path: Path, limit: int | None = None, *, follow: bool = True) -> BinaryIO:
    """`path` opened for reading, as a regular file of at most `limit` bytes, else OSError:
    NotRegular, TooLarge, or the open's own (FileNotFoundError...). Opened without waiting
    (O_NONBLOCK: opening a FIFO, or reading one, would wait forever for a writer) and
    checked through the handle opened, so the file checked is the file read. Not `follow`:
    a link in `path`'s place is refused (ELOOP), for files only memagent writes."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    flags = os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    if not nonblock and os.path.exists(path) and not os.path.isfile(path):  # Windows
        raise NotRegular(errno.EINVAL, "it is not a regular file", str(path))
    try:
        handle = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise NotRegular(errno.ELOOP, "it is not a regular file (a link)", str(path)) from None
        raise
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(errno.EINVAL, "it is not a regular file", str(path))
        if limit is not None and info.st_size > limit:
            raise TooLarge(path, info.st_size, limit)
        if nonblock:
            os.set_blocking(handle, True)
        return os.fdopen(handle, "rb")
    except BaseException:
        os.close(handle)
        raise


def read_checked(path: Path, limit: int, *, follow: bool = True) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (open_checked), read
    only that far: a file that grew past `limit` since is TooLarge too."""
    with open_checked(path, limit, follow=follow) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(path, len(data), limit)
    return data


def open_regular(
    path: Path, what: str, *, limit: int | None = None, error: type[UserError] = UserError
) -> BinaryIO:
    """`path` opened for reading if it is a regular file of at most `limit` bytes; otherwise
    `error` with one sentence. `what` names the file in that sentence ("trace")."""
    try:
        return open_checked(path, limit)
    except FileNotFoundError:
        raise error(f"{what.capitalize()} not found: {path}") from None
    except NotRegular:
        raise error(f"{what.capitalize()} {path} is not a regular file.") from None
    except TooLarge as exc:
        raise error(
            f"{what.capitalize()} {path} is {exc.size:,} bytes; the limit is {limit:,}."
        ) from None
    except OSError as exc:
        raise error(f"Cannot read {what} {path}: {exc.strerror}.") from None


def lines(
    file: BinaryIO, *, limit: int = MAX_LINE_BYTES, follow: bool = False, poll: float = 0.2
) -> Iterator[tuple[bytes, str] | None]:
    """(line, state) for each line of `file`, read a bounded piece at a time: state "" for a
    whole line, "cut" for a last line without its newline, "long" for one over `limit`
    bytes (its first 64 bytes; the rest is read past, never held whole). With
    `follow`, a last line waits for the rest, and None marks each poll in which nothing
    arrived."""
    pending, dropping = b"", False
    while True:
        data = file.readline(limit + 1 - len(pending))
        if not data and follow:
            time.sleep(poll)
            data = file.readline(limit + 1 - len(pending))
            if not data:
                yield None
                continue
        if not data:
            if pending and not dropping:
                yield pending, "cut"
            return
        pending += data
        if pending.endswith(b"\n"):
            if not dropping:
                yield pending, ""
            pending, dropping = b"", False
        elif len(pending) > limit:
            if not dropping:
                yield pending[:64], "long"
            pending, dropping = b"", True


def drop_partial_line(path: Path) -> None:
    """Cut a line left half-written by a crash, so appended lines start on their own line."""
    with path.open("r+b") as file:
        size = file.seek(0, os.SEEK_END)
        back = min(size, MAX_LINE_BYTES)
        file.seek(size - back)
        tail = file.read(back)
        end = size - back + tail.rfind(b"\n") + 1
        if end < size:
            file.truncate(end)


def check_gguf(path: Path) -> None:
    """Fail with a sentence (ModelError) unless `path` can be read and starts like a GGUF
    file: llama.cpp would crash or abort on anything else."""
    if path.exists() and not path.is_file():  # a FIFO would block the read below forever
        raise ModelError(f"{path} is not a regular file, so not a GGUF model file.")
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        raise ModelError(f"Cannot read model {path}: {exc.strerror or exc}.") from None
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF model file (llama.cpp reads GGUF models only).")
