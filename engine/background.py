"""A loop a process runs beside its main work for as long as it runs: balancing
leaders, recording and following group 0's record, moving replicas."""

from __future__ import annotations

import asyncio


class Background:
    """Runs the subclass's ``_run`` coroutine as a task of the running event loop
    from ``start`` until ``stop``."""

    _task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        raise NotImplementedError
