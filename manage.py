#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchgen_site.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ValueError as exc:
        # A misconfiguration (core.config.SettingError, known by its name:
        # importing the package reads the settings, which is what failed) is one
        # message naming the setting, not a traceback.
        if type(exc).__name__ != "SettingError":
            raise
        sys.exit(f"BatchGen cannot start: {exc}")


if __name__ == "__main__":  # vLLM spawns its engine process: keep the guard.
    main()
