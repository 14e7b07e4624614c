"""Celery with kombu's MongoDB transport, for bench/mongo_peers.py: enqueue, then drain.

Runs in a throwaway venv holding celery and pymongo (celery is not a dependency of this
workspace), as ``bench/mongo_peers.py --celery-python PATH`` starts it:

    uv venv /tmp/celery-venv && VIRTUAL_ENV=/tmp/celery-venv uv pip install celery pymongo
    /tmp/celery-venv/bin/python bench/mongo_celery_peer.py --url mongodb://... --tasks 1000

``--tasks`` no-op tasks are sent one by one (``delay``; kombu has no batch publish), then
one worker (thread pool of ``--concurrency``, no results, no remote control, gossip,
mingle or heartbeat) runs them in this process; it prints one JSON line: the enqueue
rate, and the processing rate from the first task's start to the last one's end (the
worker's start-up is not counted).

As shipped, kombu's MongoDB transport does not run on nx-27017. Three things stand in
its way, and this peer works around each (``--as-shipped`` turns the workarounds off, to
show the first error):

1. kombu reads ``server_info()["version"]``; nx-27017's ``buildInfo`` answers
   ``{"ok": 1, "result": []}``: ``KeyError: 'version'``. Worked around by answering
   ``version: 7.0.0`` when the server gives none.
2. kombu's default collection names ``messages.broadcast``, ``messages.routing``,
   ``messages.queues`` are refused by nx-27017 ("Invalid identifier
   'messages.broadcast'"). Worked around with kombu's own transport options, naming
   them with ``_``.
3. kombu indexes ``messages`` on (queue, priority, _id); with that index, every insert
   into the collection fails on nx-27017 ("JSON path error near '_id'"). Worked around
   by creating the index without ``_id``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from typing import Any

from celery import Celery


def work_around_the_stand_in() -> None:
    import kombu.transport.mongodb as km
    import pymongo.synchronous.mongo_client as mc

    shipped = mc.MongoClient.server_info

    def server_info(self: Any, session: Any = None) -> dict[str, Any]:
        info: dict[str, Any] = shipped(self, session)
        info.setdefault("version", "7.0.0")
        return info

    def ensure_indexes(self: Any, database: Any) -> None:
        database[self.messages_collection].create_index([("queue", 1), ("priority", 1)])
        database[self.broadcast_collection].create_index([("queue", 1)])
        database[self.routing_collection].create_index([("queue", 1), ("exchange", 1)])

    mc.MongoClient.server_info = server_info  # type: ignore[method-assign]
    km.Channel._ensure_indexes = ensure_indexes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--as-shipped", action="store_true")
    args = parser.parse_args()
    if not args.as_shipped:
        work_around_the_stand_in()
    app = Celery("bench", broker=args.url)
    app.conf.update(
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        broker_connection_retry_on_startup=True,
    )
    if not args.as_shipped:
        app.conf.broker_transport_options = {
            "broadcast_collection": "messages_broadcast",
            "routing_collection": "messages_routing",
            "queues_collection": "messages_queues",
        }
    lock = threading.Lock()
    marks: dict[str, float] = {}
    ran = 0
    all_ran = threading.Event()

    def noop(i: int) -> None:
        nonlocal ran
        now = time.perf_counter()
        with lock:
            marks.setdefault("first", now)
            ran += 1
            if ran == args.tasks:
                marks["last"] = time.perf_counter()
                all_ran.set()

    task = app.task(name="noop")(noop)
    started = time.perf_counter()
    for i in range(args.tasks):
        task.delay(i)
    enqueue_s = time.perf_counter() - started

    def stop_when_done() -> None:
        if all_ran.wait(timeout=1800):
            os.kill(os.getpid(), signal.SIGTERM)  # a warm shutdown

    threading.Thread(target=stop_when_done, daemon=True).start()
    worker = app.Worker(
        pool="threads",
        concurrency=args.concurrency,
        loglevel="WARNING",
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
        quiet=True,
    )
    worker.start()
    if not all_ran.is_set():
        raise SystemExit(f"celery ran {ran} of {args.tasks} tasks")
    print(
        json.dumps(
            {
                "tasks": args.tasks,
                "concurrency": args.concurrency,
                "enqueue_per_s": args.tasks / enqueue_s,
                "process_per_s": args.tasks / (marks["last"] - marks["first"]),
                "workarounds": not args.as_shipped,
            }
        )
    )


if __name__ == "__main__":
    main()
