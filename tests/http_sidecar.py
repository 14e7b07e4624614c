"""A sidecar that receives tasks from taskmill's HttpHandler, written with the standard
library only (as a sidecar in any language would be): what it does with a task is
named by ``params["behavior"]``.

    python tests/http_sidecar.py PORT SERVICE_URL TOKEN LOG_FILE

It prints ``ready`` once listening; every notable thing it sees is appended to LOG_FILE
as one JSON object per line (``{"event": ..., "task": ...}``).

Behaviors: ``ok`` (200 with ``{"echo": params["value"], "attempt": n}``), ``reject``
(422), ``flaky`` (503 until attempt ``params["succeed_on"]``), ``hang`` (never answers;
logs ``aborted`` when the worker closes the connection), ``die_once`` (the process exits
mid-request the first time the task arrives; 200 after that), ``detach`` (202, then
progress reports and a ``completed`` status), ``detach_until_cancelled`` (202, then
progress every 0.1 s until a report gets 409, logged as ``refused``),
``detach_silent`` (202 and nothing more), ``detach_and_die`` (202, then the process
exits).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

PORT, SERVICE, TOKEN, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]


def log(event: str, task_id: str, **extra: Any) -> None:
    with open(LOG, "a") as out:
        out.write(json.dumps({"event": event, "task": task_id, **extra}) + "\n")


def report(task_id: str, what: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{SERVICE}/v1/tasks/{task_id}/{what}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def seen(task_id: str) -> list[dict[str, Any]]:
    """What the log holds of ``task_id`` (also from before a restart)."""
    with open(LOG) as lines:
        return [e for e in map(json.loads, lines) if e["task"] == task_id]


async def detached(task_id: str, lease: str, behavior: str) -> None:
    if behavior == "detach":
        for done in (1, 2):
            await asyncio.sleep(0.1)
            await asyncio.to_thread(
                report, task_id, "progress", {"lease": lease, "done": done, "total": 2}
            )
        status, _ = await asyncio.to_thread(
            report,
            task_id,
            "status",
            {"lease": lease, "status": "completed", "result": {"detached": True}},
        )
        log("reported", task_id, status=status)
    elif behavior == "detach_until_cancelled":
        while True:
            await asyncio.sleep(0.1)
            status, body = await asyncio.to_thread(
                report, task_id, "progress", {"lease": lease, "done": 1}
            )
            if status == 409:
                log("refused", task_id, code=body["error"]["code"])
                return
    elif behavior == "detach_and_die":
        await asyncio.sleep(0.05)
        os._exit(1)


async def respond(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    reason = {200: "OK", 202: "Accepted", 422: "Unprocessable", 503: "Unavailable"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            request = json.loads(await reader.readexactly(length))
            task, lease = request["task"], request["lease"]
            params, attempt = task["params"], task["attempt"]
            behavior = params.get("behavior", "ok")
            log("received", task["id"], attempt=attempt, behavior=behavior, app_id=task["app_id"])
            if behavior == "ok":
                await respond(writer, 200, {"echo": params.get("value"), "attempt": attempt})
            elif behavior == "reject":
                await respond(writer, 422, {"error": "this input cannot be processed"})
            elif behavior == "flaky":
                ok = attempt >= params["succeed_on"]
                await respond(writer, 200 if ok else 503, {"attempt": attempt})
            elif behavior == "hang":
                await reader.read(1)  # returns b"" once the worker closes the connection
                log("aborted", task["id"], attempt=attempt)
                return
            elif behavior == "die_once":
                if len(seen(task["id"])) == 1:  # the first time this task arrives: die mid-request
                    os._exit(1)
                await respond(writer, 200, {"survived": True, "attempt": attempt})
            else:
                await respond(writer, 202, {"accepted": True})
                if behavior != "detach_silent":
                    asyncio.get_running_loop().create_task(detached(task["id"], lease, behavior))
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve_connection, "127.0.0.1", PORT)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
