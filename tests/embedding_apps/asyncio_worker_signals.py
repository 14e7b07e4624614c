"""A plain asyncio program whose worker owns SIGINT and SIGTERM.

Nothing else in this process handles them, so ``worker.run()`` takes them: the first
signal stops the worker gracefully, a second one cuts the grace short.
"""

import asyncio

from taskmill import Taskmill

import reports


async def main() -> None:
    async with Taskmill() as tm:  # $TASKMILL_URL, else sqlite:///taskmill.db
        reports.register(tm)
        worker = tm.worker(concurrency=4, shutdown_grace=5)
        await worker.run()  # returns once a signal has stopped the worker
        stopped_by = worker.stop_signal.name if worker.stop_signal else "stop()"
        print(f"worker stopped by {stopped_by}", flush=True)
    print("shutdown complete", flush=True)  # the rest of your shutdown code


if __name__ == "__main__":
    asyncio.run(main())
