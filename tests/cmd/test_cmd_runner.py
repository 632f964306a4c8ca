"""One way to run a command: start-up errors as one line and exit 1, the coroutine's own status,
and every subcommand registered with the parser that ``metricsd`` and ``python -m metricsd`` use."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from metricsd.cmd.main import COMMANDS, build_parser
from metricsd.cmd.runner import run_main


async def _fails() -> None:
    raise OSError("cannot listen on 127.0.0.1:7401 (in use?)")


async def _returns(code: int) -> int:
    return code


def test_an_expected_start_up_error_is_one_line_and_exit_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main("metricsd store", _fails()) == 1
    assert capsys.readouterr().err == "metricsd store: cannot listen on 127.0.0.1:7401 (in use?)\n"


def test_an_unexpected_error_is_not_swallowed() -> None:
    with pytest.raises(OSError):
        run_main("metricsd store", _fails(), errors=(ValueError,))


def test_a_coroutine_returning_a_status_returns_it() -> None:
    assert run_main("metricsd hpa", _returns(3)) == 3


@pytest.mark.parametrize("command", ["up", "query", "hpa", "vpa", "overcommit", "agent", "store", "proxy",
                                     "config-server", "cluster", "chaos"])
def test_every_subcommand_has_a_run(command: str) -> None:
    argv = {"cluster": ["cluster", "status", "--etcd", "127.0.0.1:2379"],
            "config-server": ["config-server", "--id", "cs-1", "--etcd", "127.0.0.1:2379"],
            "proxy": ["proxy", "--etcd", "127.0.0.1:1"],
            "query": ["query", "--metric", "m"]}.get(command, [command])
    for parser in (build_parser(), build_parser(argv)):  # every command, and only the one asked for
        args = parser.parse_args(argv)
        assert callable(args.run)


def test_commands_names_every_subcommand_and_its_module() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)


def test_a_command_imports_only_its_own_module() -> None:
    """A store process does not load the consumers, the agent or the embedded default."""
    code = ("import sys\nfrom metricsd.cmd.main import COMMANDS, build_parser\n"
            "build_parser(['store', '--grpc-port', '1']).parse_args(['store', '--grpc-port', '1'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('metricsd.consumers', 'metricsd.agent', "
            "'metricsd.cmd.up'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("command", [["up"], ["proxy", "--etcd", "127.0.0.1:1"]])
def test_a_process_that_sends_nothing_onward_does_not_load_pyarrow(command: list[str]) -> None:
    """pyarrow is ~90 MiB resident (metricsd up idle: 167 MiB with it, 87 without): only remote write
    out and the Parquet writer need it, so it is imported when they are configured, not at start."""
    code = ("import sys\nfrom metricsd.cmd.main import build_parser\n"
            f"import metricsd.cmd.{command[0]}\n"
            f"build_parser({command!r}).parse_args({command!r})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'fsspec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_metricsd_is_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "metricsd", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("metricsd ")
