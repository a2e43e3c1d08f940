"""Where this process stands in a data-parallel run: its rank under torchrun or TF_CONFIG.
Backends read it (MultiWorkerMirroredStrategy); run/workers.py launches the workers."""
from __future__ import annotations

import json
import os


def tf_config() -> dict:
    """TF_CONFIG parsed ({} when unset or not JSON: TensorFlow then trains alone)."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except json.JSONDecodeError:
        return {}
    return config if isinstance(config, dict) else {}


def tf_config_workers() -> int:
    """How many training tasks (chief + workers) TF_CONFIG names."""
    cluster = tf_config().get("cluster") or {}
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def rank() -> int:
    """This process's rank under torchrun or TF_CONFIG (0 when not distributed). Under
    TF_CONFIG the chief is rank 0, else worker 0 (MultiWorkerMirroredStrategy's own choice)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ.get("RANK", "0"))
    if tf_config_workers() > 1:
        task = tf_config().get("task") or {}
        if task.get("type") == "chief":
            return 0
        has_chief = bool((tf_config().get("cluster") or {}).get("chief"))
        return int(task.get("index", 0)) + (1 if has_chief else 0)
    return 0


def under_launcher() -> bool:
    return ("WORLD_SIZE" in os.environ and "RANK" in os.environ) or tf_config_workers() > 1


# `compress --workers` names a folder where every rank leaves its exit code: torchrun reports
# any failed rank as 1, and a bad input (2) or a failed gate (3) must reach the user as such
EXIT_CODES_ENV = "COMPRESSOR_RANK_EXIT_CODES"


def record_exit_code(code: int) -> None:
    """This rank's exit code, for the `--workers` launcher (nothing outside it)."""
    folder = os.environ.get(EXIT_CODES_ENV)
    if folder and under_launcher() and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank{rank()}"), "w") as handle:
            handle.write(str(code))


def recorded_exit_code(folder: str, launcher_code: int) -> int:
    """Rank 0's exit code when it failed, else the first failed rank's, else the launcher's."""
    codes = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name[4:].isdigit():
            with open(os.path.join(folder, name)) as handle:
                text = handle.read().strip()
            if text.lstrip("-").isdigit():
                codes[int(name[4:])] = int(text)
    failed = [codes[r] for r in sorted(codes) if codes[r] != 0]
    return failed[0] if failed else launcher_code
