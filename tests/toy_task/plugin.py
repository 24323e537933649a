"""The toy task as a plug-in: a process started with PYTHONPATH=tests CORESCALE_BACKENDS=toy_task.plugin registers it
(the CLI's and every worker's: docs/tasks.md)."""

from corescale.workload.tasks import register
from toy_task import TOYSCORE

register(TOYSCORE)
