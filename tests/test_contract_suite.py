"""The contract suite itself: one class carries every topic, capability marks skip
with a reason and only where a store declares a gap, a store that claims what it
cannot do fails, and docs/backends.md lists each first-party backend's gaps."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import taskmill.testing
from taskmill.backends.memory import MemoryStorage
from taskmill.backends.sqlite import SQLiteStorage
from taskmill.storage import StorageCapabilities, TaskStorage
from taskmill.testing import (
    SCENARIOS,
    DeploymentContract,
    DeploymentHooks,
    Scenario,
    StorageContract,
    requires,
)
from taskmill.testing.capabilities import CAPABILITIES, required_capabilities
from taskmill_mongo import MongoStorage
from taskmill_mysql import MySQLStorage
from taskmill_postgres import PostgresStorage

from tests import (
    test_contract_memory,
    test_contract_mongo,
    test_contract_mysql,
    test_contract_postgres,
    test_contract_sqlite,
)

DOCS = Path(__file__).parent.parent / "docs" / "backends.md"


def _all_suite_tests() -> dict[str, str]:
    """Every contract test defined in a module of taskmill.testing, by name: its module."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(taskmill.testing.__path__):
        module = importlib.import_module(f"taskmill.testing.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for name in vars(cls):
                if name.startswith("test_"):
                    assert name not in found, f"{name} is defined twice"
                    found[name] = info.name
    return found


def _suite_tests() -> dict[str, str]:
    """The tests of StorageContract's topic modules: every module but deployment."""
    return {name: module for name, module in _all_suite_tests().items() if module != "deployment"}


def _deployment_tests() -> set[str]:
    return {name for name, module in _all_suite_tests().items() if module == "deployment"}


def test_storage_contract_carries_every_test_of_every_topic_module():
    tests = _suite_tests()
    assert len(tests) >= 100
    missing = [name for name in tests if not hasattr(StorageContract, name)]
    assert missing == []
    assert {"claims", "finish", "dedupe", "control", "events", "migrations", "concurrency"} <= set(
        tests.values()
    )


def test_deployment_contract_carries_every_deployment_test_each_of_one_scenario():
    tests = _deployment_tests()
    assert len(tests) >= 10
    assert [name for name in tests if not hasattr(DeploymentContract, name)] == []
    scenarios = {getattr(DeploymentContract, name).__taskmill_scenario__ for name in tests}
    assert scenarios == set(SCENARIOS)
    assert not set(tests) & {name for name in dir(StorageContract) if name.startswith("test_")}


def test_a_scenario_declared_not_applicable_must_be_a_known_one():
    with pytest.raises(TypeError, match="unknown scenarios sever; known: schema_versions"):

        class Typo(DeploymentContract):
            not_applicable = {"sever": "no server"}  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("module", "backend"),
    [
        (test_contract_memory, MemoryStorage),
        (test_contract_sqlite, SQLiteStorage),
        (test_contract_postgres, PostgresStorage),
        (test_contract_mysql, MySQLStorage),
        (test_contract_mongo, MongoStorage),
    ],
    ids=["memory", "sqlite", "postgres", "mysql", "mongo"],
)
def test_every_first_party_backend_runs_every_deployment_scenario(
    module: object, backend: type[TaskStorage]
):
    """One DeploymentContract class per backend, with each scenario either given its
    hooks or declared not applicable (a declared scenario's tests skip, naming why)."""
    (deployment,) = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, DeploymentContract) and cls is not DeploymentContract
    ]
    assert deployment.storage_class is backend
    hooks: dict[Scenario, tuple[str, ...]] = {
        "schema_versions": ("set_schema_version", "footprint", "distribution"),
        "foreign_data": ("plant_foreign_data", "footprint"),
        "server": ("unreachable_url",),
        "urls": ("bad_urls",),
        "worker_processes": (),
        "store_enforced_dedupe": ("insert_active_task", "unique_violation"),
    }
    assert set(hooks) == set(SCENARIOS)
    for scenario, names in hooks.items():
        if scenario in deployment.not_applicable:
            assert deployment.not_applicable[scenario], scenario  # a reason, not ""
            continue
        for name in names:
            given = getattr(deployment, name, None)
            assert given is not None and given is not getattr(DeploymentHooks, name, None), (
                f"{deployment.__name__} neither gives {name} nor declares {scenario}"
            )


def test_requires_names_capabilities_that_exist():
    assert set(CAPABILITIES) == {f.name for f in StorageCapabilities.__attrs_attrs__}
    with pytest.raises(ValueError, match="unknown capability sharde"):
        requires("sharde")
    with pytest.raises(ValueError, match="none given"):
        requires()

    @requires("durable")
    @requires("notifications")
    def needs_both() -> None: ...

    assert set(required_capabilities(needs_both)) == {"durable", "notifications"}


def test_lacking_lists_the_false_flags_in_field_order():
    caps = StorageCapabilities(durable=False, notifications=True, commit_ordered_cursors=False)
    assert caps.lacking() == (
        "durable",
        "commit_ordered_cursors",
        "handler_registrations",
        "worker_registry",
    )


_THIRD_PARTY = '''
import pytest
from taskmill.backends.memory import MemoryStorage
from taskmill.storage import StorageCapabilities
from taskmill.testing import SCENARIOS, DeploymentContract, StorageContract


class ForgetfulStorage(MemoryStorage):
    """A store that keeps no handler registrations, and says so."""

    capabilities = StorageCapabilities(
        durable=False, shared_between_processes=False, handler_registrations=False
    )


class BoastfulStorage(MemoryStorage):
    """A store that claims to be shared between processes, and is not."""

    capabilities = StorageCapabilities(
        durable=False, shared_between_processes=True, handler_registrations=True
    )


def fixture_for(cls):
    @pytest.fixture
    async def storage(self):
        store = cls()
        await store.open()
        yield store
        await store.close()

    return storage


class TestForgetful(StorageContract):
    storage = fixture_for(ForgetfulStorage)


class TestBoastful(StorageContract):
    storage = fixture_for(BoastfulStorage)


class TestUndeclaredDeployment(DeploymentContract):
    """Gives no hook and declares nothing not applicable."""

    storage_class = ForgetfulStorage

    @pytest.fixture
    def deployment_url(self):
        return "memory://"


class TestDeclaredDeployment(TestUndeclaredDeployment):
    not_applicable = {name: f"{name} is not for a memory store" for name in SCENARIOS}
'''


@pytest.fixture(scope="module")
def third_party_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Run the suite as a third party would, on two stores of its own, in a pytest of
    its own; every test's outcome ("passed", "skipped", "failed") and message."""
    directory = tmp_path_factory.mktemp("third_party")
    (directory / "test_backend.py").write_text(textwrap.dedent(_THIRD_PARTY))
    report = directory / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            # All of the one; of the other, two tests that race two store objects
            # (the rest would wait out their deadlines on stores that share nothing).
            "-k",
            "TestForgetful or (TestBoastful and (one_leader or never_claim_the_same))"
            " or Deployment",
            f"--junitxml={report}",
            "--rootdir",
            str(directory),
            str(directory / "test_backend.py"),
        ],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                outcome = {"failure": "failed", "error": "failed"}.get(child.tag, child.tag)
                message = child.get("message", "")
        outcomes[name] = outcome, message
    return outcomes


def _base(name: str) -> str:
    return name.split("::")[1].split("[")[0]


def test_a_third_party_store_runs_every_test_by_subclassing_one_class(third_party_run):
    forgetful = {k: v for k, v in third_party_run.items() if k.startswith("TestForgetful::")}
    assert {_base(k) for k in forgetful} == set(_suite_tests())
    failed = {k: v for k, v in forgetful.items() if v[0] == "failed"}
    assert failed == {}
    skipped = {_base(k): v[1] for k, v in forgetful.items() if v[0] == "skipped"}
    # Exactly the tests whose capabilities it declares missing, each saying why.
    for name, message in skipped.items():
        needed = required_capabilities(getattr(StorageContract, name))
        if "migrations" in message:
            assert name in {
                "test_migrations_are_numbered_from_one_without_gaps",
                "test_a_fresh_schema_equals_all_migrations_applied_in_order",
            }
        else:
            assert needed and "ForgetfulStorage declares it lacks" in message, name
    registrations = [n for n in _suite_tests() if "registration" in n]
    assert registrations and all(n in skipped for n in registrations)
    assert all("handler_registrations" in skipped[n] for n in registrations)


def test_a_store_that_claims_a_capability_it_lacks_fails_the_tests_that_need_it(
    third_party_run,
):
    boastful = {_base(k): v for k, v in third_party_run.items() if k.startswith("TestBoastful::")}
    failed = {name for name, (outcome, _) in boastful.items() if outcome == "failed"}
    needs_sharing = {
        name
        for name in _suite_tests()
        if "shared_between_processes" in required_capabilities(getattr(StorageContract, name))
    }
    assert failed == {
        "test_two_store_objects_dedupe_to_one_leader",
        "test_two_store_objects_never_claim_the_same_task",
    }
    assert failed <= needs_sharing


def test_a_deployment_scenario_either_runs_or_is_declared_not_applicable(third_party_run):
    """Declared: every test skips, naming the scenario and the reason. Undeclared: every
    test that needs a hook fails asking for it; none passes or skips on its own but the
    race of worker processes, which the store's capabilities skip."""
    declared = {
        _base(k): v for k, v in third_party_run.items() if k.startswith("TestDeclaredDeployment::")
    }
    assert set(declared) == _deployment_tests()
    for name, (outcome, message) in declared.items():
        scenario = getattr(DeploymentContract, name).__taskmill_scenario__
        assert outcome == "skipped", name
        assert message == (
            f"TestDeclaredDeployment declares {scenario} not applicable: "
            f"{scenario} is not for a memory store"
        )
    undeclared = {
        _base(k): v
        for k, v in third_party_run.items()
        if k.startswith("TestUndeclaredDeployment::")
    }
    assert set(undeclared) == _deployment_tests()
    not_failed = {name: v for name, v in undeclared.items() if v[0] != "failed"}
    assert not_failed == {
        "test_worker_processes_never_claim_the_same_task": (
            "skipped",
            "ForgetfulStorage declares it lacks shared_between_processes "
            "(StorageCapabilities), which this test needs",
        ),
        "test_a_wrong_password_is_unavailable_without_showing_it": (
            "skipped",
            "the test server's URL has no password to change",
        ),
    }
    for name, (_, message) in undeclared.items():
        if name not in not_failed:
            assert "TestUndeclaredDeployment gives no `" in message, (name, message)


def _documented_gaps() -> dict[str, set[str]]:
    """From the capability table of docs/backends.md: per URL scheme, the capabilities
    whose cell starts with "no"."""
    lines = DOCS.read_text().splitlines()
    start = lines.index("## Capabilities")
    header = next(line for line in lines[start:] if line.startswith("| capability"))
    schemes = [cell.strip(" `") for cell in header.strip("|").split("|")[1:]]
    gaps: dict[str, set[str]] = {scheme: set() for scheme in schemes}
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        (name,) = re.findall(r"^`(\w+)`", cells[0])
        for scheme, cell in zip(schemes, cells[1:], strict=True):
            if cell.startswith("no"):
                gaps[scheme].add(name)
    return gaps


@pytest.mark.parametrize(
    ("scheme", "backend"),
    [
        ("memory://", MemoryStorage),
        ("sqlite:///", SQLiteStorage),
        ("postgresql://", PostgresStorage),
        ("mysql://", MySQLStorage),
        ("mongodb://", MongoStorage),
    ],
)
def test_docs_list_exactly_the_capabilities_each_backend_lacks(
    scheme: str, backend: type[TaskStorage]
):
    documented = _documented_gaps()
    assert set(documented[scheme]) == set(backend.capabilities.lacking())
    rows = {line.split("`")[1] for line in DOCS.read_text().splitlines() if line.startswith("| `")}
    assert set(CAPABILITIES) <= rows


async def test_what_a_store_declares_missing_is_refused_clearly_storing_nothing(
    monkeypatch: pytest.MonkeyPatch,
):
    """A store declaring it lacks ``dependencies`` and ``global_limits`` (no first-party
    backend does now; a third-party one may): the core refuses ``after=`` at enqueue,
    storing nothing, and a worker with limited handlers refuses to start."""
    from typing import Any

    import attrs
    from taskmill import ConfigurationError, InvalidTaskSpec, Taskmill

    lacking = attrs.evolve(MemoryStorage.capabilities, dependencies=False, global_limits=False)
    monkeypatch.setattr(MemoryStorage, "capabilities", lacking)
    async with Taskmill("memory://", plugins=False) as tm:
        first = await tm.enqueue("t")
        with pytest.raises(InvalidTaskSpec, match="keeps task dependencies"):
            await tm.enqueue("t", after=[first.id])
        assert [t.id for t in await tm.query()] == [first.id]

        @tm.handler("limited", rate_limit="5/s")
        async def limited(ctx: Any, params: dict[str, Any]) -> None:
            return None

        with pytest.raises(ConfigurationError, match="cannot enforce global limits"):
            await tm.worker().run_until_idle()
        again = await tm.get(first.id)
        assert again is not None and again.status.value == "pending"
