"""Publishing, locking and reaping (compressor.core.workspace), in this process."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compressor.core import workspace
from compressor.errors import UsageError


def _folder(path: Path, **files: str) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_publish_fault_leaves_previous_out_intact(tmp_path, monkeypatch):
    out = _folder(tmp_path / "out", **{"report.json": "old", "model.onnx": "old onnx"})
    staging = _folder(tmp_path / ".out.partial-1-x", **{"report.json": "new"})
    real_rename = Path.rename

    def failing_rename(self, target):
        if self == staging:
            raise OSError(28, "No space left on device")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing_rename)
    with pytest.raises(OSError):
        workspace.publish(staging, out)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"report.json": "old",
                                                              "model.onnx": "old onnx"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.partial-1-x", "out", "tmp"]


def test_publish_swaps_whole_folder_with_normal_permissions(tmp_path):
    out = _folder(tmp_path / "out", **{"report.json": "old", "model.onnx": "stale"})
    staging = workspace.make_staging_folder(out)
    (staging / "report.json").write_text("new")
    workspace.publish(staging, out)
    assert [p.name for p in out.iterdir()] == ["report.json"]   # no stale model.onnx beside it
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tmp"]


def test_second_lock_holder_is_refused_naming_the_lock(tmp_path):
    out = tmp_path / "out"
    script = ("import sys, time; from pathlib import Path; from compressor.core.workspace import "
              "output_lock\nwith output_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n"
              "    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=rf"in use by another compress run \(pid {holder.pid}, "
                                             r"lock .*\.out\.lock\)"):
            with workspace.output_lock(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    with workspace.output_lock(out):   # the kernel released the dead holder's lock
        assert (tmp_path / ".out.lock").read_text().strip() == str(os.getpid())
    assert not (tmp_path / ".out.lock").exists()


def test_folders_of_dead_processes_are_reaped(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    time.sleep(0.1)
    stale = [tmp_path / f"compressor-work-{dead}-abc", tmp_path / f".out.partial-{dead}-abc"]
    live = tmp_path / f"compressor-work-{os.getpid()}-abc"
    for folder in (*stale, live):
        folder.mkdir()
    previous = _folder(tmp_path / f".out.old-{dead}-abc", **{"report.json": "previous"})
    workspace.reap_stale(tmp_path, workspace.WORK_PREFIX)
    staging = workspace.make_staging_folder(tmp_path / "out")
    assert not any(p.exists() for p in stale) and live.exists()
    # A publish killed between its two renames: the previous output is put back.
    assert (tmp_path / "out" / "report.json").read_text() == "previous"
    assert not previous.exists()
    staging.rmdir()
    live.rmdir()


def test_an_error_citing_a_work_log_keeps_it_and_cites_the_copy(tmp_path):
    import shutil

    work = workspace.make_work_folder()
    log = work / "logs" / "convert.log"
    log.parent.mkdir()
    log.write_text("converter said no\n")
    with pytest.raises(RuntimeError) as caught:
        with workspace.removed_after(work):
            raise RuntimeError(f"conversion failed (full log: {log})")
    assert not work.exists()
    kept = Path(str(caught.value).split("full log: ")[1].rstrip(")"))
    assert kept.read_text() == "converter said no\n" and kept.parent.parent.name.startswith(
        f"compressor-logs-{os.getpid()}-")
    shutil.rmtree(kept.parent.parent)


def test_force_replaces_what_a_language_model_run_wrote(tmp_path):
    """A rerun with --force over an LLM run's --out (model-onnx/, logs/, report.html) used to
    be refused as "holds files compressor did not write (model-onnx)"."""
    from compressor.errors import RecipeError
    from compressor.core.workspace import check_output_path

    out = tmp_path / "out"
    for folder in ("model-onnx", "logs"):
        (out / folder).mkdir(parents=True)
    for name in ("model.tflite", "report.json", "report.md", "report.html", "sweep.html"):
        (out / name).write_text("x")
    check_output_path(out, force=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match=r"did not write \(notes.txt\)"):
        check_output_path(out, force=True)
