"""Tasks: what a model is for, and so how its data is prepared, how artifacts are scored and
what the report shows (tasks/base.py). The built-in ones are imported here, explicitly: the
array task (classifiers, regressors, encoders) and the causal language-model task."""
from compressor.tasks.base import (OpenRequest, Opened, ReportView, Task, register_task,
                                   registered_tasks, task_named, task_of_report)
from compressor.tasks import array, lm  # noqa: F401,E402  (register the built-in tasks)

__all__ = ["OpenRequest", "Opened", "ReportView", "Task", "register_task", "registered_tasks",
           "task_named", "task_of_report"]
