"""A plain asyncio program that owns SIGINT and SIGTERM and stops its worker itself.

The program installs its handlers with ``loop.add_signal_handler`` before the worker
starts, so the worker leaves them alone.
"""

import asyncio
import signal

from taskmill import Taskmill

import reports


async def main() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async with Taskmill() as tm:  # $TASKMILL_URL, else sqlite:///taskmill.db
        reports.register(tm)
        worker = tm.worker(concurrency=4)
        running = asyncio.create_task(worker.run())
        await stop.wait()  # ... the program's own work runs meanwhile ...
        # Running tasks get 5 s to finish; the rest go back to PENDING.
        await worker.stop(grace=5)
        await running
    print("shutdown complete", flush=True)  # the rest of your shutdown code


if __name__ == "__main__":
    asyncio.run(main())
