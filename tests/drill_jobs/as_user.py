"""Run gputop's command line as another user: ``python as_user.py USER [--executable PATH] gputop-args...``.

The interpreter and its packages live under root's 0700 home on the test machine, so another user
could not even start Python there.  This starts as root, imports what the commands need, then drops
to USER for good and runs `gputop.cli.main` — from then on it is gputop running as USER.  Root only.

``--executable PATH`` sets sys.executable to PATH, a link to this interpreter in a directory USER can
read: as if gputop were installed in a virtualenv of USER's (gputop looks for py-spy next to it).
"""

from __future__ import annotations

import importlib
import os
import pwd
import sys

PRELOAD = (
    "gputop.cli",
    "gputop.commands.snapshot",
    "gputop.commands.bench",
    "gputop.bench",
    "gputop.inject.injector",
    "gputop.inject.safepoint",  # the injector imports it on first use
    "gputop.pipeline",
    "gputop.collect.gpu",
    "gputop.collect.host",
    "gputop.collect.job_tree",
    "gputop.collect.procfs",
    "gputop.collect.stack_schedule",
    "gputop.collect.stacks",
    "gputop.collect.sampler",
    "gputop.analysis.stack_classes",
    "gputop.analysis.loader_math",
    "gputop.model",
    "pynvml",
    "psutil",
    "json",
    "concurrent.futures",
    "concurrent.futures.thread",
    "subprocess",
    "tempfile",
    "shutil",
    "statistics",
    "encodings.idna",
    "gputop.commands.record",
    "gputop.commands.report",
    "gputop.recording",
    "gputop.history",
    "gputop.errors",
    "gzip",
    "zlib",
    "bisect",
    "errno",
    "pwd",
    "grp",
    "gputop.commands.check",
    "gputop.check_window",  # the check's window over a live pipeline (commands/check.py imports it on first use)
    "gputop.collect.counters",  # ... and its counter reads
    "gputop.collect.sysfs",
    "gputop.analysis.machine_check",
    "gputop.report.writer",
    "gputop.report.job_json",  # a recorded snapshot's job (commands/snapshot.py imports it on first use)
    "gputop.commands.serve",
    "gputop.exporter",
    "gputop.analysis.diagnosis",
    "prometheus_client",
    "prometheus_client.exposition",
    "prometheus_client.openmetrics.exposition",
    "prometheus_client.parser",
    "encodings.ascii",
    "encodings.latin_1",
    "gputop.collect.cgroup",
)


def main() -> int:
    user, argv = sys.argv[1], sys.argv[2:]
    if argv[:1] == ["--executable"]:
        sys.executable, argv = argv[1], argv[2:]
    for name in PRELOAD:
        importlib.import_module(name)
    entry = pwd.getpwnam(user)
    os.setgroups([])
    os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
    os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    from gputop.cli import main as gputop_main

    return gputop_main(argv)


if __name__ == "__main__":
    sys.exit(main())
