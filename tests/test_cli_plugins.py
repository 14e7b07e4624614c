"""A plugin that cannot be loaded, and plugin lists that name nothing, seen from the
``taskmill`` command. The broken plugins are installed the way pip leaves a
distribution — a ``.dist-info`` directory with an ``entry_points.txt`` — in a directory
on the subprocess's ``PYTHONPATH``, and found through their entry points alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.cli_support import CLI, cli_env, enqueue, ok

pytest_plugins = ("tests.cli_fixtures",)

INSTALLED = sorted({ep.name for ep in entry_points(group="taskmill.plugins")})
"""The plugins installed in the test environment (the workspace's own)."""


def install(site: Path, name: str, distribution: str, module: str, source: str) -> None:
    """Install a one-module distribution with a ``taskmill.plugins`` entry point
    ``name`` into ``site``, as pip would lay it out."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[taskmill.plugins]\n{name} = {module}\n")
    (info / "RECORD").write_text("")


@pytest.fixture
def broken(tmp_path: Path) -> str:
    """Two broken plugins on the command's path: ``crashy`` fails to import,
    ``badreg``'s handler registration raises. Returns the ``PYTHONPATH`` entry."""
    site = tmp_path / "site"
    site.mkdir()
    install(
        site,
        "crashy",
        "taskmill-crashy",
        "taskmill_crashy",
        """
        raise RuntimeError("crashy cannot start: missing config")
        """,
    )
    install(
        site,
        "badreg",
        "taskmill-badreg",
        "taskmill_badreg",
        """
        from taskmill import hookimpl

        @hookimpl
        def taskmill_register_handlers(registry):
            raise KeyError("no such setting")
        """,
    )
    return str(site)


def _path(site: str, tmp_path: Path) -> str:
    return f"{tmp_path}:{site}"


def test_taskmill_plugins_lists_a_broken_plugin_with_its_error(
    cli: CLI, broken: str, tmp_path: Path
) -> None:
    env = {"PYTHONPATH": _path(broken, tmp_path)}
    document = json.loads(ok(cli("plugins", "--json", **env)))

    assert {p["name"] for p in document["plugins"]} == set(INSTALLED)
    failed = {b["name"]: b for b in document["broken"]}
    assert set(failed) == {"crashy", "badreg"}
    assert failed["crashy"]["distribution"] == "taskmill-crashy"
    assert failed["crashy"]["version"] == "1.0"
    assert "failed to import: RuntimeError: crashy cannot start" in failed["crashy"]["error"]
    assert "TASKMILL_DISABLE_PLUGINS=crashy" in failed["crashy"]["error"]
    assert "taskmill_register_handlers raised KeyError" in failed["badreg"]["error"]

    table = cli("plugins", **env)
    out = ok(table)
    assert "failed to load" in out
    assert "crashy cannot start: missing config" in out
    assert "taskmill-badreg" in out
    assert "warning" in table.stderr.lower() and "crashy" in table.stderr


@pytest.mark.parametrize(
    "command", [["ls"], ["stats"], ["show", "TASK"], ["suspensions"]], ids=lambda c: c[0]
)
def test_read_commands_work_and_warn_when_a_plugin_is_broken(
    cli: CLI, url: str, broken: str, tmp_path: Path, command: list[str]
) -> None:
    task_id = enqueue(cli, url, "test.add", "--import", "cli_handlers")
    argv = [task_id if arg == "TASK" else arg for arg in command]

    process = cli("--url", url, *argv, PYTHONPATH=_path(broken, tmp_path))

    out = ok(process)
    if command[0] in ("ls", "show"):
        assert task_id[:8] in out
    assert "plugin 'crashy' (taskmill-crashy 1.0) failed to import" in process.stderr
    assert "left out" in process.stderr


@pytest.mark.parametrize("command", [["worker", "--until-idle"], ["enqueue", "test.add"]])
def test_commands_that_run_or_enqueue_tasks_stop_on_a_broken_plugin(
    cli: CLI, url: str, broken: str, tmp_path: Path, command: list[str]
) -> None:
    env = {"PYTHONPATH": _path(broken, tmp_path)}
    process = cli("--url", url, *command, "--import", "cli_handlers", **env)

    assert process.returncode == 2
    assert process.stderr.startswith("error: plugin ")
    assert "TASKMILL_DISABLE_PLUGINS=" in process.stderr
    assert "Traceback" not in process.stderr

    skipped = cli(
        "--url",
        url,
        *command,
        "--import",
        "cli_handlers",
        TASKMILL_DISABLE_PLUGINS="crashy,badreg",
        **env,
    )
    ok(skipped)


def test_disabled_plugins_are_listed_and_a_name_that_matches_nothing_is_warned_about(
    cli: CLI,
) -> None:
    process = cli("plugins", "--json", TASKMILL_DISABLE_PLUGINS="demo,dmeo")
    document = json.loads(ok(process))

    assert document["disabled"] == ["demo"]
    assert document["unmatched"] == ["dmeo"]
    assert "demo" not in {p["name"] for p in document["plugins"]}
    assert (
        "TASKMILL_DISABLE_PLUGINS names 'dmeo', which matches no installed plugin "
        "(did you mean 'demo'?)"
    ) in process.stderr

    table = ok(cli("plugins", TASKMILL_DISABLE_PLUGINS="demo"))
    assert "disabled by TASKMILL_DISABLE_PLUGINS: demo" in table


def test_an_enable_list_loads_only_its_plugins_and_lists_the_others(cli: CLI) -> None:
    document = json.loads(ok(cli("plugins", "--json", TASKMILL_ENABLE_PLUGINS="demo")))

    assert [p["name"] for p in document["plugins"]] == ["demo"]
    assert document["not_enabled"] == [n for n in INSTALLED if n != "demo"]
    table = ok(cli("plugins", TASKMILL_ENABLE_PLUGINS="demo"))
    assert "not enabled by TASKMILL_ENABLE_PLUGINS: " in table


def test_plugin_lists_from_the_configuration_file_are_named_in_messages(
    cli: CLI, tmp_path: Path
) -> None:
    (tmp_path / "taskmill.toml").write_text('disable_plugins = ["prometheus", "nope"]\n')
    process = cli("plugins")
    out = ok(process)
    assert f"disabled by disable_plugins in {tmp_path / 'taskmill.toml'}: prometheus" in out
    assert f"disable_plugins in {tmp_path / 'taskmill.toml'} names 'nope'" in process.stderr


# -- the commands of plugins that are not loaded ------------------------------------

_DEMO_MISSING = "error: taskmill demo runs the tasks of the taskmill-demo plugin, which "


def test_demo_left_out_by_the_enable_list_says_to_add_the_plugin_to_it(cli, url, tmp_path):
    process = cli("--url", url, "demo", "--tasks", "3", TASKMILL_ENABLE_PLUGINS="prometheus")

    assert process.returncode == 2
    assert process.stderr == (
        f"{_DEMO_MISSING}TASKMILL_ENABLE_PLUGINS leaves out; add 'demo' to it\n"
    )
    assert not (tmp_path / "t.db").exists()


def test_a_plugin_the_configuration_file_disables_adds_no_command(cli, url, tmp_path):
    config = tmp_path / "other.toml"
    config.write_text('disable_plugins = ["demo"]\n')

    # --config after the command, as the global options may be given.
    process = cli("--url", url, "demo", "--config", str(config))
    assert process.returncode == 2
    assert process.stderr == (
        f"{_DEMO_MISSING}disable_plugins in {config} disables; take 'demo' out of it\n"
    )
    listed = ok(cli("--config", str(config), "--help"))
    assert re.search(r"^\s+serve\s", listed, re.MULTILINE)
    assert not re.search(r"^\s+demo\s", listed, re.MULTILINE)
    assert not (tmp_path / "t.db").exists()


def test_an_unknown_command_no_plugin_of_taskmill_adds_gets_argparses_own_error(cli):
    process = cli("demoo")
    assert process.returncode == 2
    assert "invalid choice: 'demoo'" in process.stderr
    assert "pip install" not in process.stderr


def test_demo_without_the_demo_plugin_installed_says_to_install_it(tmp_path):
    # A site directory with everything the workspace installed except taskmill-demo:
    # its distribution metadata and its editable path are left out, so for the command
    # the plugin is not installed at all.
    installed = Path(sysconfig.get_paths()["purelib"])
    site = tmp_path / "site"
    site.mkdir()
    for entry in installed.iterdir():
        if not entry.name.startswith(("taskmill_demo", "_editable_impl_taskmill_demo")):
            (site / entry.name).symlink_to(entry)
    program = (
        "import site, sys\n"
        "site.addsitedir(sys.argv[1])\n"
        "from taskmill.cli import main\n"
        "sys.exit(main(sys.argv[2:]))\n"
    )

    def taskmill(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-S", "-c", program, str(site), *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=cli_env(tmp_path),
            check=False,
        )

    listed = json.loads(ok(taskmill("plugins", "--json")))
    assert {p["name"] for p in listed["plugins"]} == set(INSTALLED) - {"demo"}

    process = taskmill("--url", f"sqlite:///{tmp_path / 't.db'}", "demo", "--tasks", "3")
    assert process.returncode == 2
    assert process.stderr == (
        f"{_DEMO_MISSING}is not installed; install it with: pip install taskmill-demo\n"
    )
    assert not (tmp_path / "t.db").exists()
