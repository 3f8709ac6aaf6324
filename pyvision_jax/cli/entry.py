"""How every absl console command starts: `run_command(__name__, main)`.

- `--help` lists the command's own flags: absl lists those of the module named by
  sys.argv[0], which for a console command is its entry-point shim.
- `--help`, `-?`, `--helpshort`, `--helpfull` and `--helpxml` exit 0 after the usage, as users
  and scripts expect (absl's own help flags exit 1).
- A user error ends the command with one line (`user_errors.exits_at_once`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, flags

from pyvision_jax.cli.user_errors import exits_at_once


class _ExitsZero:
    """A help flag whose usage ends the process with status 0."""

    def parse(self, argument: str) -> None:
        try:
            super().parse(argument)
        except SystemExit as done:
            if done.code != 1:
                raise
            sys.exit(0)


class _Help(_ExitsZero, app.HelpFlag):
    pass


class _Helpshort(_ExitsZero, app.HelpshortFlag):
    pass


class _Helpfull(_ExitsZero, app.HelpfullFlag):
    pass


class _HelpXml(_ExitsZero, app.HelpXMLFlag):
    pass


def _help_exits_zero() -> None:
    """Replaces absl's help flags (registered once, before `app.run` would) by ones that exit 0."""
    app.define_help_flags()
    for flag in (_Help(), _Helpshort(), _Helpfull(), _HelpXml()):
        if isinstance(flags.FLAGS[flag.name], _ExitsZero):
            continue
        for name in {flag.name, flag.short_name} - {None}:
            delattr(flags.FLAGS, name)
        flags.DEFINE_flag(flag, module_name=app.__name__)


def _show_flags_in_help(module_name: str) -> None:
    """Makes the flags defined by `module_name` key flags of the running command."""
    for flag in flags.FLAGS.get_key_flags_for_module(module_name):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run_command(module_name: str, main: Callable[[list[str]], None]) -> None:
    """Runs `main` as the absl command defined in `module_name`."""
    _show_flags_in_help(module_name)
    _help_exits_zero()
    with exits_at_once():
        app.run(main)
