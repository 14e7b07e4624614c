"""Embedded store faults (issue 16 §5): the SQLite file on a full disk, truncated or
corrupted, and read-only. Each gets a clear TaskmillError, and nothing already
committed is lost.

The full disk and the read-only file are real: a small tmpfs mounted for the test (and
remounted read-only). Mounting needs root; elsewhere those tests skip, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import Taskmill, TaskmillError, TaskStatus

pytestmark = pytest.mark.timeout(120)


def _mount(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["mount", *args], capture_output=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of this test alone, unmounted afterwards."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    done = _mount("-t", "tmpfs", "-o", "size=4m,mode=0777", "tmpfs", str(where))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for block in (65536, 512):
            try:
                while os.write(fd, b"\0" * block):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


async def enqueue_some(tm: Taskmill, count: int, size: int = 100) -> list[str]:
    ids = []
    for i in range(count):
        task = await tm.enqueue("t", {"i": i, "pad": "x" * size})
        ids.append(task.id)
    return ids


async def assert_all_there(url: str, ids: list[str]) -> None:
    async with Taskmill(url, plugins=False) as tm:
        for task_id in ids:
            task = await tm.get(task_id)
            assert task is not None, f"committed task {task_id} lost"
            assert task.status is TaskStatus.PENDING and "pad" in task.params
        assert (await tm.progress_summary()).total == len(ids)


async def use(url: str) -> None:
    """Open the store, read everything and write one task."""
    async with Taskmill(url, plugins=False) as tm:
        await tm.query(limit=1000)
        await tm.progress_summary()
        await enqueue_some(tm, 1)


async def test_a_full_disk_gives_a_clear_error_and_loses_nothing_committed(
    small_disk: Path,
) -> None:
    url = f"sqlite:///{small_disk / 'tasks.db'}"
    async with Taskmill(url, plugins=False) as tm:
        committed = await enqueue_some(tm, 50)
        filler = fill(small_disk)

        async def enqueue_until_refused() -> None:
            for _ in range(2000):
                committed.extend(await enqueue_some(tm, 1, size=20_000))

        with pytest.raises(TaskmillError) as refused:
            await enqueue_until_refused()
        message = str(refused.value).lower()
        assert "full" in message or "space" in message, message
        # Room again: the same store object goes on.
        filler.unlink()
        committed.extend(await enqueue_some(tm, 5))
    await assert_all_there(url, committed)


async def test_a_read_only_file_gives_a_clear_error_and_loses_nothing_committed(
    small_disk: Path,
) -> None:
    url = f"sqlite:///{small_disk / 'tasks.db'}"
    async with Taskmill(url, plugins=False) as tm:
        committed = await enqueue_some(tm, 20)
    remounted = _mount("-o", "remount,ro", str(small_disk))
    assert remounted.returncode == 0, remounted.stderr
    try:
        with pytest.raises(TaskmillError) as refused:
            await use(url)
        message = str(refused.value).lower()
        assert "not writable" in message or "read-only" in message, message
    finally:
        assert _mount("-o", "remount,rw", str(small_disk)).returncode == 0
    await assert_all_there(url, committed)


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "not a database"])
async def test_a_damaged_file_gives_a_clear_error_and_is_left_as_it_was(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "tasks.db"
    url = f"sqlite:///{path}"
    async with Taskmill(url, plugins=False) as tm:
        await enqueue_some(tm, 300, size=500)
    data = path.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 3 + 7]
    elif damage == "corrupted":
        middle = len(data) // 2
        data = data[:100] + b"\xa5" * 4096 * 3 + data[100 + 4096 * 3 : middle] + data[middle:]
    else:
        data = b"these are not the tasks you are looking for\n" * 100
    path.write_bytes(data)
    with pytest.raises(TaskmillError) as refused:
        await use(url)
    message = str(refused.value)
    assert str(path) in message or "tasks.db" in message, message
    # The damaged file is left for the user to restore or inspect, byte for byte.
    assert path.read_bytes() == data
