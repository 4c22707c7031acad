"""One table of settings (core/config.py): every variable the server reads is
a row of it, the README's settings table agrees with it (names, flags, defaults),
and a value that cannot be used stops the server at start naming the setting."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.config import SERVER_SETTINGS, SettingError, read_all, readme_rows, value

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("batchgen_site", "batches", "core", "files", "inference", "webhooks")
# Names that look like settings but are not variables anyone sets: Django settings
# derived from the table, a constant, and the supervisor's hand-off to its children.
NOT_VARIABLES = {"BATCHGEN_EMBEDDED_BROKER",
                 "BATCHGEN_TERMINATION_LOG"}


def readme_table() -> dict[str, tuple[str, str]]:
    """The README's settings table: variable -> (flag, default cell)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        rows[cells[1].strip("`")] = (cells[0].strip("`"), "|".join(cells[2:]))
    return rows


def test_the_readme_lists_every_setting_of_the_table_and_no_other():
    assert sorted(readme_table()) == sorted(setting.env for setting in SERVER_SETTINGS)


@pytest.mark.parametrize("setting", SERVER_SETTINGS, ids=lambda setting: setting.env)
def test_the_readme_gives_each_setting_its_flag_and_default(setting):
    flag, default = readme_table()[setting.env]

    assert flag == (setting.flag or "")
    assert default.startswith(setting.readme_default), (
        f"README's default of {setting.env} must start with {setting.readme_default!r} "
        f"(manage.py settings_table prints its row)")


def test_the_printed_rows_are_the_tables():
    out = subprocess.run([sys.executable, "manage.py", "settings_table"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout

    assert out.splitlines()[2:] == readme_rows()


def test_the_server_reads_no_batchgen_variable_outside_the_table():
    table = {setting.env for setting in SERVER_SETTINGS}
    found = {}
    for package in SERVER_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for name in re.findall(r"\bBATCHGEN_[A-Z_]*[A-Z]\b(?!/)", path.read_text()):
                found.setdefault(name, str(path.relative_to(ROOT)))

    assert {name: where for name, where in found.items()
            if name not in table | NOT_VARIABLES} == {}


def test_the_defaults_are_each_settings_type():
    values = read_all({})

    for setting in SERVER_SETTINGS:
        assert values[setting.env] is None or isinstance(values[setting.env], setting.kind)
    assert values["BATCHGEN_MAX_POOL_SIZE"] == 10240
    assert values["BATCHGEN_PREFIX_GROUPING"] is True
    assert values["BATCHGEN_ENGINE_ARGS"] == {}


def test_a_value_out_of_bounds_or_of_the_wrong_type_names_the_setting_and_its_flag():
    with pytest.raises(SettingError) as error:
        read_all({"BATCHGEN_MAX_POOL_SIZE": "-1", "BATCHGEN_CHUNK_SIZE": "many",
                  "BATCHGEN_ENGINE_ARGS": "{", "BATCHGEN_ACCESS_LOG": "some"})

    lines = str(error.value).splitlines()
    assert len(lines) == 4
    for said in ("BATCHGEN_MAX_POOL_SIZE='-1' (--max-pool-size): must be at least 1",
                 "BATCHGEN_CHUNK_SIZE='many': not an integer",
                 "BATCHGEN_ENGINE_ARGS='{' (--engine-args): not JSON",
                 "BATCHGEN_ACCESS_LOG='some' (--access-log): must be one of"):
        assert any(line.startswith(said) for line in lines), said


def test_an_empty_engine_priority_sends_none_and_an_empty_number_is_its_default():
    assert value("BATCHGEN_ENGINE_PRIORITY", {"BATCHGEN_ENGINE_PRIORITY": ""}) is None
    assert value("BATCHGEN_ENGINE_PRIORITY", {}) == 100
    assert value("BATCHGEN_CHUNK_SIZE", {"BATCHGEN_CHUNK_SIZE": ""}) == 200
    assert value("BATCHGEN_MAX_CONTEXT_LENGTH", {}) is None


def test_a_misconfigured_server_says_so_once_at_start_naming_the_setting(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "BATCHGEN_STORAGE_PATH": str(tmp_path),
           "BATCHGEN_MAX_POOL_SIZE": "0"}

    result = subprocess.run([sys.executable, "manage.py", "serve"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 1
    assert result.stderr.strip() == (
        "BatchGen cannot start: BATCHGEN_MAX_POOL_SIZE='0' (--max-pool-size): must be at "
        "least 1; slots (requests inside the engine at once) per inference worker")
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize(("env", "raw", "said"), [
    ("BATCHGEN_ADAPTIVE_TARGET", "1", "must be at least 1.05"),
    ("BATCHGEN_ADAPTIVE_TARGET", "101", "must be at most 100"),
    ("BATCHGEN_ADAPTIVE_FLOOR", "0", "must be at least 1"),
    ("BATCHGEN_ADAPTIVE_CEILING", "0", "must be at least 1"),
    ("BATCHGEN_ADAPTIVE_CEILING", "100001", "must be at most 100000"),
])
def test_adaptive_concurrency_settings_out_of_bounds_are_refused(env, raw, said):
    with pytest.raises(SettingError) as error:
        value(env, {env: raw})
    assert str(error.value).startswith(f"{env}={raw!r}") and said in str(error.value)


def test_adaptive_concurrency_defaults_and_a_floor_above_the_ceiling():
    assert [value(env, {}) for env in ("BATCHGEN_ADAPTIVE_CONCURRENCY",
                                       "BATCHGEN_ADAPTIVE_TARGET", "BATCHGEN_ADAPTIVE_FLOOR",
                                       "BATCHGEN_ADAPTIVE_CEILING")] == [True, 1.5, 1, 256]
    assert value("BATCHGEN_ADAPTIVE_TARGET", {"BATCHGEN_ADAPTIVE_TARGET": "1.05"}) == 1.05
    with pytest.raises(SettingError) as error:
        read_all({"BATCHGEN_ADAPTIVE_FLOOR": "64", "BATCHGEN_ADAPTIVE_CEILING": "8"})
    assert str(error.value) == "BATCHGEN_ADAPTIVE_FLOOR=64 is above BATCHGEN_ADAPTIVE_CEILING=8"
