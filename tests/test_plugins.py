"""Plugin discovery, end to end: plugin distributions are written, built into wheels and
installed into a directory during the test, and a separate Python process with that
directory on its path finds them through their ``taskmill.plugins`` entry points alone.
Also: plugin objects added in code, and the errors for plugins that cannot be used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from taskmill import (
    Context,
    HandlerConflict,
    PluginError,
    Taskmill,
    hookimpl,
)

PYPROJECT = """\
[project]
name = "{distribution}"
version = "{version}"
requires-python = ">=3.11"
dependencies = ["taskmill"]

[project.entry-points."taskmill.plugins"]
{entry_point} = "{module}"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["src/{module}"]
"""

DISTRIBUTIONS: dict[str, dict[str, str]] = {
    # A well-behaved handler plugin: an async and a sync handler under its own app.
    "acme": {
        "distribution": "taskmill-acme",
        "version": "1.2.0",
        "module": "taskmill_acme",
        "source": """
            from taskmill import hookimpl

            async def shout(ctx, params):
                await ctx.progress(1, 1, "shouted")
                return {"shout": params["text"].upper()}

            def count_words(ctx, params):
                return len(params["text"].split())

            @hookimpl
            def taskmill_register_handlers(registry):
                registry.register("shout", shout, app_id="acme", max_retries=2)
                registry.register("count", count_words, app_id="acme", concurrency=1)
        """,
    },
    # Registers a key acme already has.
    "acme-clone": {
        "distribution": "taskmill-acme-clone",
        "version": "0.3.0",
        "module": "taskmill_acme_clone",
        "source": """
            from taskmill import hookimpl

            async def shout(ctx, params):
                return "clone"

            @hookimpl
            def taskmill_register_handlers(registry):
                registry.register("shout", shout, app_id="acme")
        """,
    },
    # Needs a dependency that is not installed.
    "broken": {
        "distribution": "taskmill-broken",
        "version": "2.0.0",
        "module": "taskmill_broken",
        "source": """
            import taskmill_missing_dependency  # noqa: F401
        """,
    },
    # Written for a taskmill that has a hook this one does not.
    "future": {
        "distribution": "taskmill-future",
        "version": "9.0.0",
        "module": "taskmill_future",
        "source": """
            from taskmill import hookimpl

            @hookimpl
            def taskmill_task_exploded(task):
                pass
        """,
    },
}

RUNNER = '''
"""Open a Taskmill with the installed plugins, run acme's tasks, print what happened."""
import asyncio, json, sys
from taskmill import Taskmill, TaskmillError

async def main(plugins):
    tm = Taskmill("memory://", plugins=plugins)
    try:
        await tm.open()
    except TaskmillError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    try:
        shout = await tm.enqueue("shout", {"text": "hello"}, app_id="acme")
        count = await tm.enqueue("count", {"text": "a b c"}, app_id="acme")
        await tm.run_worker(until_idle=True, handle_signals=False, idle_horizon=0)
        tasks = [await tm.get(shout.id), await tm.get(count.id)]
        print(json.dumps({
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.distribution,
                    "version": p.version,
                    "handlers": [[h.app_id, h.task_type, h.max_retries] for h in p.handlers],
                }
                for p in tm.plugins
            ],
            "modules": sorted(m for m in sys.modules if m.startswith("taskmill_")),
            "tasks": [[t.status.value, t.result, t.max_retries] for t in tasks],
        }))
    finally:
        await tm.close()

asyncio.run(main(sys.argv[1] == "plugins"))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each distribution above, built into a wheel and installed into a directory of
    its own: name -> that directory."""
    uv = shutil.which("uv")
    assert uv, "building the test plugins needs uv on PATH"
    root = tmp_path_factory.mktemp("plugins")
    wheels = root / "wheels"
    sites: dict[str, Path] = {}
    for entry_point, spec in DISTRIBUTIONS.items():
        project = root / "src" / entry_point
        package = project / "src" / spec["module"]
        package.mkdir(parents=True)
        (project / "pyproject.toml").write_text(PYPROJECT.format(entry_point=entry_point, **spec))
        (package / "__init__.py").write_text(textwrap.dedent(spec["source"]))
        _run([uv, "build", "--wheel", "--out-dir", str(wheels / entry_point), str(project)])
        (wheel,) = (wheels / entry_point).glob("*.whl")
        site = sites[entry_point] = root / "site" / entry_point
        install = [uv, "pip", "install", "--no-deps", "--python", sys.executable]
        _run([*install, "--target", str(site), str(wheel)])
        assert (site / spec["module"] / "__init__.py").exists()
    return sites


def _run(argv: list[str]) -> None:
    process = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert process.returncode == 0, f"{argv} failed:\n{process.stdout}\n{process.stderr}"


def _run_taskmill(
    installed: dict[str, Path], *names: str, plugins: bool = True, **env: str
) -> dict[str, Any]:
    """Run RUNNER in a new process whose path has the given installed plugins."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TASKMILL_")}
    environ["PYTHONPATH"] = os.pathsep.join(str(installed[n]) for n in names)
    environ.update(env)
    process = subprocess.run(
        [sys.executable, "-c", RUNNER, "plugins" if plugins else "none"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout.splitlines()[-1])


def test_an_installed_plugin_is_found_through_its_entry_point_and_its_handlers_run(installed):
    outcome = _run_taskmill(installed, "acme")

    (acme,) = [p for p in outcome["plugins"] if p["name"] == "acme"]
    assert acme == {
        "name": "acme",
        "distribution": "taskmill-acme",
        "version": "1.2.0",
        "handlers": [["acme", "shout", 2], ["acme", "count", None]],
    }
    assert outcome["tasks"] == [["completed", {"shout": "HELLO"}, 2], ["completed", 3, 3]]
    assert "taskmill_acme" in outcome["modules"]


def test_plugins_false_loads_no_installed_plugin(installed):
    outcome = _run_taskmill(installed, "acme", plugins=False)
    assert outcome["plugins"] == []
    assert outcome["modules"] == []
    # No handler: the tasks wait, visible as pending, for a worker that has one.
    assert [t[0] for t in outcome["tasks"]] == ["pending", "pending"]


def test_taskmill_disable_plugins_skips_the_named_plugins(installed):
    outcome = _run_taskmill(installed, "acme", TASKMILL_DISABLE_PLUGINS="demo, acme")
    assert [p["name"] for p in outcome["plugins"]] == ["http", "otel", "prometheus"]
    assert "taskmill_acme" not in outcome["modules"]
    assert [t[0] for t in outcome["tasks"]] == ["pending", "pending"]


def test_a_plugin_that_fails_to_import_stops_open_naming_it(installed):
    outcome = _run_taskmill(installed, "acme", "broken")
    assert outcome["error"] == "PluginError"
    message = outcome["message"]
    assert message.startswith("plugin 'broken' (taskmill-broken 2.0.0) failed to import: ")
    assert "No module named 'taskmill_missing_dependency'" in message
    assert "TASKMILL_DISABLE_PLUGINS=broken" in message

    skipped = _run_taskmill(installed, "acme", "broken", TASKMILL_DISABLE_PLUGINS="broken")
    assert [t[0] for t in skipped["tasks"]] == ["completed", "completed"]


def test_a_plugin_implementing_an_unknown_hook_stops_open_naming_it(installed):
    outcome = _run_taskmill(installed, "acme", "future")
    assert outcome["error"] == "PluginError"
    assert outcome["message"].startswith(
        "plugin 'future' (taskmill-future 9.0.0) implements unknown hook(s) taskmill_task_exploded"
    )
    assert "taskmill_task_finished" in outcome["message"]  # the hooks that do exist


def test_two_plugins_registering_one_task_type_of_one_app_is_a_conflict_naming_both(installed):
    outcome = _run_taskmill(installed, "acme", "acme-clone")
    assert outcome["error"] == "HandlerConflict"
    assert outcome["message"] == (
        "task type 'shout' of app 'acme' is registered twice: by plugin 'acme' "
        "(taskmill-acme 1.2.0) and by plugin 'acme-clone' (taskmill-acme-clone 0.3.0); "
        "remove one of them or give one an app_id of its own"
    )


def test_taskmill_plugins_lists_an_installed_plugin(installed):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TASKMILL_")}
    environ["PYTHONPATH"] = str(installed["acme"])
    process = subprocess.run(
        [sys.executable, "-m", "taskmill.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    (acme,) = [p for p in json.loads(process.stdout)["plugins"] if p["name"] == "acme"]
    assert acme["distribution"] == "taskmill-acme" and acme["version"] == "1.2.0"
    assert acme["hooks"] == ["taskmill_register_handlers"]
    assert [(h["app_id"], h["task_type"], h["concurrency"]) for h in acme["handlers"]] == [
        ("acme", "shout", None),
        ("acme", "count", 1),
    ]


# -- plugins added in code (in this process) -----------------------------------------


class Greeter:
    """A handler plugin object, as an application would write one."""

    @hookimpl
    def taskmill_register_handlers(self, registry: Any) -> None:
        registry.register("greet", self.greet, app_id="hello")

    async def greet(self, ctx: Context, params: dict[str, Any]) -> str:
        return f"hello {params['name']}"


async def test_a_plugin_object_passed_to_taskmill_registers_its_handlers_at_open():
    async with Taskmill("memory://", plugins=[Greeter()]) as tm:
        info = tm.plugins.get("Greeter")
        assert info is not None and info.distribution is None
        assert [(h.app_id, h.task_type) for h in info.handlers] == [("hello", "greet")]
        task = await tm.enqueue("greet", {"name": "ada"}, app_id="hello")
        await tm.run_worker(until_idle=True, handle_signals=False)
        assert (await tm.wait(task.id, timeout=5)).result == "hello ada"
        # Entry points were loaded too.
        assert tm.plugins.get("demo") is not None


async def test_add_plugin_after_open_registers_its_handlers_at_once(tm: Taskmill):
    info = tm.add_plugin(Greeter(), name="greeter")
    assert info.label == "plugin 'greeter' (added in code)"
    assert [h.task_type for h in info.handlers] == ["greet"]
    assert tm.registry.lookup("hello", "greet") is not None


async def test_a_plugin_handler_that_conflicts_with_the_applications_names_both():
    tm = Taskmill("memory://", plugins=False)

    @tm.handler("greet", app_id="hello")
    async def greet(ctx: Context, params: dict[str, Any]) -> None:
        return None

    tm.add_plugin(Greeter(), name="greeter")
    with pytest.raises(HandlerConflict) as raised:
        await tm.open()
    assert "by application and by plugin 'greeter' (added in code)" in str(raised.value)
    # Nothing was opened or half-registered: the application's handler is intact.
    assert tm.registry.lookup("hello", "greet").source == "application"  # type: ignore[union-attr]
    assert tm.plugins.get("greeter").handlers == ()  # type: ignore[union-attr]


def test_invalid_plugin_objects_are_refused_with_a_message_naming_them():
    class Undecorated:
        def taskmill_task_finished(self, task: Any) -> None:
            pass

    class Wrapper:
        @hookimpl(wrapper=True)
        def taskmill_task_finished(self, task: Any) -> Any:
            return (yield)

    class AsyncRegistration:
        @hookimpl
        async def taskmill_register_handlers(self, registry: Any) -> None:
            pass

    class WrongArgument:
        @hookimpl
        def taskmill_task_finished(self, task: Any, colour: str) -> None:
            pass

    tm = Taskmill("memory://", plugins=False)
    with pytest.raises(PluginError, match="defines taskmill_task_finished without marking it"):
        tm.add_plugin(Undecorated())
    with pytest.raises(PluginError, match="is a pluggy wrapper, which taskmill does not support"):
        tm.add_plugin(Wrapper())
    with pytest.raises(PluginError, match=r"plugin 'WrongArgument' .* not a valid taskmill plugin"):
        tm.add_plugin(WrongArgument())
    tm.add_plugin(Greeter(), name="twice")
    with pytest.raises(PluginError, match="a plugin named 'twice' is already loaded"):
        tm.add_plugin(Greeter(), name="twice")
    tm.add_plugin(AsyncRegistration())
    with pytest.raises(PluginError, match="taskmill_register_handlers must be a plain def"):
        tm.load_plugins()
    assert [p.name for p in tm.plugins] == ["twice", "AsyncRegistration"]
    assert tm.registry.lookup("hello", "greet") is None  # rolled back with the failure


async def test_a_plugin_registration_that_raises_is_a_plugin_error_and_open_can_be_retried():
    class Flaky:
        calls = 0

        @hookimpl
        def taskmill_register_handlers(self, registry: Any) -> None:
            Flaky.calls += 1
            registry.register("one", _noop)
            if Flaky.calls == 1:
                raise RuntimeError("config file missing")
            registry.register("two", _noop)

    tm = Taskmill("memory://", plugins=[Flaky()])
    with pytest.raises(PluginError, match=r"'Flaky' .*raised RuntimeError: config file missing"):
        await tm.open()
    assert len(tm.registry) == 0
    async with tm:
        assert sorted(
            h.task_type for h in tm.registry if h.source.startswith("plugin 'Flaky'")
        ) == [
            "one",
            "two",
        ]


async def _noop(ctx: Context, params: dict[str, Any]) -> None:
    return None


async def test_add_plugin_whose_handler_conflicts_after_open_leaves_no_trace(tm: Taskmill):
    tm.add_plugin(Greeter(), name="first")
    with pytest.raises(HandlerConflict, match=r"by plugin 'first' .* and by plugin 'second'"):
        tm.add_plugin(Greeter(), name="second")
    assert tm.plugins.get("second") is None
    assert [h.source for h in tm.registry] == ["plugin 'first' (added in code)"]

    class Quiet:
        @hookimpl
        def taskmill_task_enqueued(self) -> None:
            pass

    assert tm.add_plugin(Quiet(), name="second").hooks == ("taskmill_task_enqueued",)
