"""One way to write files: never through a symbolic link, never half-written, full disks named.

Every file the project writes or locks goes through here. A path whose last component is a
symbolic link is refused, not followed (a link planted where a run writes `metrics.jsonl`, a
lock or a report would otherwise rewrite whatever file it points to), and so is a path that is
not a regular file (a FIFO would block the writer forever). `write_atomic` writes a temporary
sibling (created with O_EXCL, so it never follows a link), fsyncs it and renames it over the
target: a reader sees the old file or the new one, and when the disk is full (ENOSPC, EDQUOT,
or EFBIG past a file-size limit) the temporary file is removed, the old file stays, and the
failure is one located `DiskFull` line (`located_disk_full` does the same for writers that are
not this module's: safetensors, `save_pretrained`); `write_folder` replaces a whole folder the
same way. `open_nofollow` opens for appending or locking with
O_NOFOLLOW. `check_folder` refuses a folder path that is a symbolic link loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from nemo_fp8_rl.config.temp_files import sibling_prefix, sweep_siblings
from nemo_fp8_rl.config.user_error import RUNTIME, USAGE, UserError

FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class UnsafePath(UserError):
    """A path the project will not write through: a symbolic link, a loop, a FIFO (exit 2)."""

    code = USAGE


class DiskFull(UserError):
    """A write that ran out of space; what was there before is kept (exit 1)."""

    code = RUNTIME


def refuse_link(path: Path) -> None:
    """Raise `UnsafePath` when `path` is a symbolic link (dangling or looping ones too)."""
    path = Path(path)
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise UnsafePath(
            path,
            f"is a symbolic link (to {target}); nothing was written through it",
            "remove the link (the file it points to is untouched), or choose another path",
        )


def check_folder(path: Path, what: str = "folder") -> Path:
    """`path` resolved; a symbolic link loop on the way is an `UnsafePath`."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: Python < 3.13 on a loop
        raise UnsafePath(
            path,
            f"is a symbolic link loop, so it names no {what} ({exc})",
            f"remove the link, or give another {what}",
        ) from exc


def disk_full(path: Path, exc: OSError, kept: str) -> DiskFull:
    """The located error for a write to `path` that ran out of space."""
    return DiskFull(
        path,
        f"{exc.strerror or exc} while writing; {kept}",
        "free space on that disk (or raise the file-size limit) and run the command again",
    )


def write_atomic(
    path: Path,
    data: str | bytes,
    mode: int | None = None,
    check: Callable[[Path], object] | None = None,
) -> None:
    """Replace `path` with `data` atomically; never through a link, the old file kept on failure.

    `check(tmp)`, when given, reads the complete temporary file before it replaces `path` (a
    recipe copy that must load as the original does): whatever it raises leaves `path` as it was.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else data
    write_atomic_with(path, lambda handle: handle.write(blob), mode, check)


def write_atomic_with(
    path: Path,
    fill: Callable[[BinaryIO], object],
    mode: int | None = None,
    check: Callable[[Path], object] | None = None,
) -> None:
    """`write_atomic` for a writer that streams into a binary handle (`torch.save(obj, f)`):
    `fill(handle)` writes the temporary sibling, which then replaces `path`."""
    path = Path(path)
    refuse_link(path)
    kind = not_a_file(path)
    if kind is not None:  # a pipe is not written (nothing would read it), a folder not replaced
        raise UnsafePath(path, f"is {kind}, not a regular file", "choose another path")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)  # ours: created above, never a link (O_EXCL)
        full = out_of_space(exc)
        if full is not None:
            kept = "the previous file is kept" if path.exists() else "nothing was written"
            raise disk_full(path, full, kept) from exc
        raise


def out_of_space(exc: BaseException) -> OSError | None:
    """The disk-full error behind `exc` (an OSError with errno in `FULL`, or a writer's own
    error that carries only the message, as safetensors' does), else None."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        return exc
    if not isinstance(exc, Exception) or isinstance(exc, UserError):
        return None
    text = str(exc)
    for code in sorted(FULL):
        if os.strerror(code) in text:
            return OSError(code, os.strerror(code))
    return None


@contextlib.contextmanager
def located_disk_full(path: Path, kept: str) -> Iterator[None]:
    """Turn running out of space inside the block (`out_of_space`) into `DiskFull` naming
    `path` and saying what was `kept`; the block cleans up what it wrote itself."""
    try:
        yield
    except Exception as exc:
        full = out_of_space(exc)
        if full is None:
            raise
        raise disk_full(path, full, kept) from exc


def write_folder(path: Path, build: Callable[[Path], object], what: str = "folder") -> None:
    """Replace the folder `path` by one `build(tmp)` fills: built in a temporary sibling (ours,
    made by `mkdtemp`), swapped in only when complete, the old folder moved aside first and
    deleted last; `path` itself must not be a link. Any failure leaves `path` as it was; a full
    disk is a `DiskFull` naming `path` ("the earlier <what> is kept" or "nothing was written")."""
    path = Path(path)
    refuse_link(path)
    if path.exists() and not path.is_dir():
        raise UnsafePath(path, "is a file, not a folder", "remove it, or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    for tag in ("tmp", "old"):  # what a killed writer (SIGKILL) left beside `path`
        sweep_siblings(path, tag)
    tmp = Path(tempfile.mkdtemp(prefix=sibling_prefix(path, "tmp"), dir=path.parent))
    try:
        build(tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        full = out_of_space(exc)
        if full is not None:
            kept = f"the earlier {what} is kept" if path.exists() else "nothing was written"
            raise disk_full(path, full, kept) from exc
        raise
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=sibling_prefix(path, "old"), dir=path.parent))
        os.replace(path, old / "previous")
    try:
        os.replace(tmp, path)
    except OSError:
        if old is not None:
            os.replace(old / "previous", path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # ours: made by mkdtemp above


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open` of a regular file without following a final symbolic link; returns the fd."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or path.is_symlink():
            refuse_link(path)
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise UnsafePath(path, "is not a regular file", "remove it") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(path, "is not a regular file", "remove it, or choose another path")
    os.set_blocking(fd, True)
    return fd


def open_append(path: Path):
    """A text handle appending to `path` (created if missing), never through a link."""
    fd = open_nofollow(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def not_a_file(path: Path, st_mode: int | None = None) -> str | None:
    """What `path` is when it is not a regular file ("a named pipe", "a folder", "a device",
    "a socket"), None for a regular file or a missing path."""
    if st_mode is None:
        try:
            st_mode = os.stat(path).st_mode
        except OSError:
            return None
    kinds = (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(st_mode)), None)


def read_bytes_bounded(path: Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: opened without blocking
    (a named pipe nobody writes would hang the read), refused with a located `UnsafePath` naming
    what it really is (pipe, folder, device, link loop) or its size past `limit`."""
    data, _ = _read_regular(Path(path), limit, what, refuse_large=True)
    return data


def _read_regular(path: Path, limit: int, what: str, refuse_large: bool) -> tuple[bytes, int]:
    """(at most `limit` bytes of `path`, its size): `read_bytes_bounded`'s open and refusals;
    past `limit` refused when `refuse_large`, else cut."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(path, "is a symbolic link loop", "remove the link") from exc
        if exc.errno == errno.ENOENT:
            raise UnsafePath(path, f"no such {what}", "check the path") from exc
        raise
    st = os.fstat(fd)
    kind = not_a_file(path, st.st_mode)
    if kind is not None or (refuse_large and st.st_size > limit):
        os.close(fd)
    if kind is not None:
        raise UnsafePath(path, f"is {kind}, not a {what}", f"pass a regular {what}")
    if refuse_large and st.st_size > limit:
        raise UnsafePath(
            path,
            f"is {st.st_size:,} bytes, more than the {limit:,} a {what} may have",
            f"pass the {what} itself (is it the right file?)",
        )
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        if refuse_large:
            raise UnsafePath(path, f"is more than {limit:,} bytes", f"pass a smaller {what}")
        data = data[:limit]
    return data, max(st.st_size, len(data))


def read_prefix(path: Path, limit: int, what: str = "file") -> tuple[bytes, int]:
    """The first `limit` bytes of the regular file `path` and its size, for readers that report
    what they read and say where they stopped (an event file grown past any run's size); the
    open and the refusals are `read_bytes_bounded`'s."""
    return _read_regular(Path(path), limit, what, refuse_large=False)


def read_text_bounded(path: Path, limit: int, what: str = "file") -> str:
    """`read_bytes_bounded` decoded as UTF-8; a non-text file is a located `UnsafePath`."""
    data = read_bytes_bounded(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafePath(
            path,
            f"is not UTF-8 text (byte {exc.start:,} is 0x{data[exc.start]:02x})",
            f"pass a UTF-8 text {what}",
        ) from exc
