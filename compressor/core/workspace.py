"""Where a run writes: its work folder, the lock on --out, and publishing into --out.

- Work and staging folders carry their run's pid in the name (`compressor-work-<pid>-*` in
  the temp dir, `.<out>.partial-<pid>-*` beside --out). A run removes its own on every exit
  path; folders of processes that no longer exist (kill -9, power loss) are removed by the
  next run that makes one in the same place.
- `.<out>.lock` beside --out, held with flock (the kernel drops it when the process dies),
  keeps two runs off one --out.
- `publish` swaps whole folders: the old --out is moved aside, the finished folder renamed
  into place, and only then the old one removed; a failure puts the old one back, so a reader
  sees the old complete folder or the new complete one, never a mix.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from compressor.errors import RecipeError, UsageError

WORK_PREFIX = "compressor-work-"
# Pseudo file systems: writing there is never what a user meant (and may change the kernel).
FORBIDDEN_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
# What a run writes into --out; --force replaces a folder holding only these. logs/: a failed
# format's converter logs; model-onnx/: an LLM's folder; split/: its stages (--devices).
OUR_FILES = ("report.json", "report.md", "report.html", "sweep.csv", "sweep.html", "pareto.png",
             "logs", "model-onnx", "split")
OUR_PREFIXES = ("model.",)

_held: dict[Path, int] = {}   # resolved --out -> lock file descriptor, locks this process holds
_removing: set[Path] = set()  # work folders a removed_after body is running for


# ----------------------------------------------------------------------- checking --out

def check_output_path(out: Path, force: bool) -> None:
    """Refuse an --out that cannot take this run's results, before any work starts
    (RecipeError, as these checks always were: exit 2)."""
    out = Path(os.path.abspath(out))
    if any(out == root or root in out.parents for root in FORBIDDEN_ROOTS):
        raise RecipeError(f"--out {out} is on a kernel pseudo file system; choose a normal folder")
    ancestor = out
    while not _exists(ancestor):
        ancestor = ancestor.parent
    if ancestor == out and not out.is_dir():
        raise RecipeError(f"--out {out} is a file; give a folder")
    if not ancestor.is_dir():
        raise RecipeError(f"--out {out} is under {ancestor}, which is a file; give a folder")
    writable = ancestor.parent if ancestor == out else ancestor
    if not os.access(writable, os.W_OK | os.X_OK):
        raise RecipeError(f"--out {out}: cannot write in {writable} (read-only or no permission); "
                         "choose a folder you can write to")
    if ancestor == out and any(out.iterdir()):
        if not force:
            raise RecipeError(f"--out {out} exists and is not empty; pass --force to replace its "
                             "artifacts and report, or choose another folder")
        foreign = sorted(p.name for p in out.iterdir() if not _ours(p.name))
        if foreign:
            raise RecipeError(f"--out {out} holds files compressor did not write "
                             f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                             "--force replaces the whole folder, so move them or choose another")


def _ours(name: str) -> bool:
    return name in OUR_FILES or name.startswith(OUR_PREFIXES)


def _exists(path: Path) -> bool:
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return False
        raise RecipeError(f"{path}: {exc.strerror}; give a shorter or valid path") from None
    return True


# --------------------------------------------------------------------- the lock on --out

@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold `.<out>.lock` beside `out` for the body; another process holding it -> UsageError.
    Re-entrant within a process (compress holds it for the run, publish asks again)."""
    key = Path(os.path.abspath(out))
    if key in _held:
        yield
        return
    key.parent.mkdir(parents=True, exist_ok=True)
    lock_path = key.parent / f".{key.name}.lock"
    fd = _acquire(lock_path, key)
    _held[key] = fd
    try:
        yield
    finally:
        del _held[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)   # unlinked before it is released: see _acquire's inode check
        os.close(fd)


def _acquire(lock_path: Path, out: Path) -> int:
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UsageError(f"--out {out} is in use by another compress run (pid {holder}, lock "
                             f"{lock_path}); wait for it to finish or choose another --out"
                             ) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:   # else its holder unlinked it between our open and flock: try again
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


# ----------------------------------------------------------------- work and staging folders

def make_work_folder() -> Path:
    """This run's private scratch folder in the temp dir (stale ones of dead runs reaped)."""
    temp = Path(tempfile.gettempdir())
    reap_stale(temp, WORK_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=temp))


def make_staging_folder(out: Path) -> Path:
    """The folder beside `out` that artifacts and report are written into before publishing."""
    out = Path(os.path.abspath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    reap_stale(out.parent, f".{out.name}.partial-")
    reap_stale(out.parent, f".{out.name}.old-", restore_to=out)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))


def reap_stale(folder: Path, prefix: str, restore_to: Path | None = None) -> None:
    """Remove `prefix<pid>-*` folders whose process is gone. With `restore_to`, such a folder
    is a previous output moved aside by a publish that died: put it back if nothing replaced it."""
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            pid = entry.name[len(prefix):].split("-", 1)[0] if entry.name.startswith(prefix) else ""
            if not pid.isdigit() or _alive(int(pid)):
                continue
            if not entry.is_dir() or entry.is_symlink():
                entry.unlink(missing_ok=True)   # e.g. the TensorFlow import log
            elif restore_to is not None and not restore_to.exists():
                entry.rename(restore_to)
            else:
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # exists, owned by someone else
    return True


# ------------------------------------------------------------------------------ publishing

def publish(staging: Path, out: Path) -> Path:
    """Make the finished `staging` folder `out`, swapping whole folders (see module doc)."""
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)   # mkdtemp made it 0700; a published folder is a normal one
    with output_lock(out):
        if not out.exists():
            staging.rename(out)
            return out
        aside = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        out.rename(aside)
        try:
            staging.rename(out)
        except BaseException:
            aside.rename(out)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    return out


@contextlib.contextmanager
def removed_after(workdir: Path) -> Iterator[None]:
    """Remove `workdir` when the body ends, however it ends. An error whose message cites a log
    inside it keeps that log in the temp dir and is rewritten to cite the kept copy.
    Meanwhile TMPDIR points into `workdir`, so what libraries and converters write to temp
    files goes with it too (and is reaped with it after a kill -9). Re-entrant: a nested
    call for the same folder leaves it all to the outer one (else the inner one removed the
    folder before the outer one could keep a log, and kept its copy inside the folder)."""
    workdir = Path(workdir)
    if workdir in _removing:
        yield
        return
    _removing.add(workdir)
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    private = Path(workdir) / "tmp"
    private.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(private)
    try:
        yield
    except BaseException as exc:
        _restore_tmpdir(*saved)
        _keep_cited_logs(exc, Path(workdir))
        raise
    finally:
        _removing.discard(workdir)
        _restore_tmpdir(*saved)
        shutil.rmtree(workdir, ignore_errors=True)


def _restore_tmpdir(environ: str | None, module: str | None) -> None:
    if environ is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = environ
    tempfile.tempdir = module


def _keep_cited_logs(exc: BaseException, workdir: Path) -> None:
    text = str(exc)
    if not exc.args or str(workdir) not in text:
        return
    kept = Path(tempfile.mkdtemp(prefix=f"compressor-logs-{os.getpid()}-"))
    with contextlib.suppress(OSError):
        shutil.copytree(workdir, kept, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if not n.endswith(".log")
                                                      and not Path(folder, n).is_dir()])
    exc.args = (text.replace(str(workdir), str(kept)), *exc.args[1:])
