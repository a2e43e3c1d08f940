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
