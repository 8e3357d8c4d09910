"""Warnings that a library podrun imports raises in podrun's process are for that library's maintainers,
not for podrun's user: every line on the user's terminal is podrun's or the job's.

A release of cryptography (51.0) made every `import asyncssh` print ten lines of its deprecation of DSA;
google.api_core warns on import, once per Python version Google stops serving (3.10 from 2026-10-11).
Each is ignored where podrun imports the library (transport/ssh_library.py, cloud/__init__.py), for
that category and that library's modules alone, so a warning of podrun's own still shows, and a
library's other warnings still show. A user who asks for warnings (`-W`, PYTHONWARNINGS, `-X dev`)
gets them all, as Python's own idiom for libraries that quiet warnings has it.
"""

from __future__ import annotations

import re
import sys
import warnings


def ignore_warnings_of(package: str, category: type[Warning]) -> None:
    """Ignore `category` warnings raised from the code of `package` or its submodules, unless the user
    asked for warnings."""
    if sys.warnoptions or sys.flags.dev_mode:
        return
    warnings.filterwarnings("ignore", category=category, module=rf"{re.escape(package)}(\.|$)")
