"""A program that exits with EX_CONFIG (78: its configuration can never work) is not
restarted by serve's supervisor, which says why in one line from the program's
termination log; any other exit is restarted as before."""

from __future__ import annotations

import logging
import os
import sys

from batchgen_site.supervisor import TERMINATION_LOG_ENV, Program, Supervisor
from tests.e2e.harness import wait_until

SAYS_WHY_AND_EXITS_78 = (
    f"import os, sys; open(os.environ[{TERMINATION_LOG_ENV!r}], 'w').write('the engine "
    "cannot start:\\nchange BATCHGEN_ENGINE_ARGS\\n'); sys.exit(78)")


def watch_until_exited(supervisor: Supervisor, program: Program) -> None:
    wait_until(lambda: program.process.poll() is not None, timeout=30,
               message=f"{program.name} to exit")
    supervisor._watch()


def test_a_program_exiting_with_ex_config_is_not_restarted_and_says_why(tmp_path, caplog):
    program = Program("inference1", [sys.executable, "-c", SAYS_WHY_AND_EXITS_78])
    supervisor = Supervisor([program], run_dir=tmp_path)
    supervisor._spawn(program)

    with caplog.at_level(logging.INFO, logger="batchgen.supervisor"):
        watch_until_exited(supervisor, program)
        for _ in range(3):
            supervisor._watch()

    assert program.process.returncode == os.EX_CONFIG == 78
    assert program.given_up and program.restart_at is None and program.restarts == 0
    said = [r.getMessage() for r in caplog.records
            if r.name == "batchgen.supervisor" and r.levelno >= logging.WARNING]
    assert said == [f"inference1 (pid {program.process.pid}) cannot start with this "
                    "configuration and is not restarted: the engine cannot start: change "
                    "BATCHGEN_ENGINE_ARGS"]


def test_any_other_exit_is_restarted(tmp_path, caplog):
    program = Program("inference1", [sys.executable, "-c", "import sys; sys.exit(1)"])
    supervisor = Supervisor([program], run_dir=tmp_path)
    supervisor._spawn(program)

    with caplog.at_level(logging.INFO, logger="batchgen.supervisor"):
        watch_until_exited(supervisor, program)

    assert not program.given_up
    assert program.restart_at is not None
    assert "restarting in 1 s" in caplog.text


def test_ex_config_without_a_termination_log_still_stops_the_restarts(tmp_path, caplog):
    program = Program("inference1", [sys.executable, "-c", "import sys; sys.exit(78)"])
    supervisor = Supervisor([program])  # no run_dir: nothing to read
    supervisor._spawn(program)

    with caplog.at_level(logging.INFO, logger="batchgen.supervisor"):
        watch_until_exited(supervisor, program)

    assert program.given_up and program.restart_at is None
    assert "its own log above tells why" in caplog.text
