"""absl's --help lists the flags of the module named by sys.argv[0]; a console command's
sys.argv[0] is its entry-point shim, so each command lists its own module's flags there."""

from __future__ import annotations

import sys

from absl import flags


def show_flags_in_help(module_name: str) -> None:
    """Makes the flags defined by `module_name` key flags of the running command."""
    for flag in flags.FLAGS.get_key_flags_for_module(module_name):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
