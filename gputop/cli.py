"""Command line: parses arguments and hands each subcommand to the module that owns it.

Every subcommand module exposes ``run(args) -> int`` and is imported lazily, so
``gputop snapshot`` and ``gputop report`` never load Textual, and nothing loads
torch.  Errors meant for the user are raised as `GputopError` / `UsageError`
and printed as one line; nothing reaches the terminal as a traceback unless
GPUTOP_DEBUG=1 asks for it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, Optional, Sequence

from gputop import __version__
from gputop.errors import GputopError, UsageError
from gputop.sim import DEFAULT_PROFILE

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse prints a usage block and exits 2; we want one line and the same code."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a whole number such as 12345)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (it must be positive)")
    return value


def _add_simulate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--simulate",
        nargs="?",
        const=DEFAULT_PROFILE,
        default=None,
        metavar="PROFILE",
        help=(
            "read a simulated machine instead of NVML: h100-sxm-8 (default) or rtx-4090-2, "
            "optionally with faults, e.g. h100-sxm-8+thermal=2+gpu-lost=3@10 "
            "(see `gputop snapshot --help-faults`)"
        ),
    )


def _add_pid(p: argparse.ArgumentParser, required: bool = False, help_text: Optional[str] = None) -> None:
    p.add_argument(
        "--pid",
        type=_pid,
        required=required,
        help=help_text or "attach to this training job: the launcher (torchrun), one rank, or a plain python train.py",
    )


def _seconds_or_off(text: str) -> float:
    """A cadence in seconds, 0 for off."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 (off) or more seconds")
    return value


def _add_followed_pids(p: argparse.ArgumentParser, verb: str) -> None:
    """`serve` and `record`: the jobs followed with their stacks (the same options give the same jobs)."""
    p.add_argument(
        "--pid",
        type=_pid,
        nargs="+",
        action="extend",
        metavar="PID",
        help=f"{verb} these jobs only (a launcher, a rank or a plain python train.py); default: every job on the GPUs",
    )
    p.add_argument(
        "--watch-counters",
        type=_seconds_or_off,
        default=None,
        metavar="SECONDS",
        help="read gputop check's counters (PCIe replays, NVLink errors, AER, kernel-log XIDs) every SECONDS (default 60; 0: never)",
    )


def _add_interval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS", help="refresh interval (default 1)")
    p.add_argument(
        "--stack-interval",
        type=_positive_float,
        default=2.0,
        metavar="SECONDS",
        help="py-spy stack refresh interval while stacks are shown or a report collects (default 2)",
    )


def _add_demo_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop demo`'s options."""
    p = sub.add_parser("demo", help="run a real PyTorch job on a simulated 8-GPU machine and watch it")
    p.add_argument(
        "--scenario",
        default="starved",
        choices=[
            "starved",
            "hiccup",
            "misfire",
            "single-gpu",
            "tuned",
            "tuned-amp",
            "nccl-hang",
            "eval-rank0",
            "sync-bound",
            "case-study",
        ],
        help="which idle profile the job reproduces (default starved)",
    )
    p.add_argument(
        "--nccl-timeout",
        type=_positive_float,
        default=600.0,
        metavar="S",
        help="the simulated NCCL watchdog's timeout in the nccl scenarios (default 600, PyTorch's)",
    )
    p.add_argument("--workers", type=int, default=None, metavar="N", help="DataLoader num_workers per rank")
    p.add_argument("--batch-size", type=int, default=None, metavar="N", help="samples per batch")
    p.add_argument("--step-ms", type=_positive_float, default=None, metavar="MS", help="simulated GPU time per step")
    p.add_argument("--gpus", type=int, default=None, metavar="N", help="number of ranks / simulated GPUs (default 8)")
    p.add_argument("--no-tui", action="store_true", help="run headless and print a summary (for scripts)")
    p.add_argument(
        "--json", action="store_true", help="case-study: one JSON object per stage (stage, steps_per_s, verdict, finding, fix)"
    )
    p.add_argument("--seconds", type=_positive_float, default=None, metavar="S", help="stop after S seconds")
    _add_interval(p)


def _add_bench_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop bench`'s options."""
    p = sub.add_parser("bench", help="can this DataLoader feed the GPUs? measure it and advise settings")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=_pid, help="a running rank (or its launcher) to benchmark")
    target.add_argument("--loader", metavar="MODULE:FUNCTION", help="offline: call this factory for a DataLoader and sweep it")
    p.add_argument("--seconds", type=_positive_float, default=15.0, metavar="S", help="bound on the whole run (default 15)")
    p.add_argument("--yes", action="store_true", help="allow the active tier: inject a small agent into the job")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_trace_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop trace`'s options."""
    p = sub.add_parser("trace", help="profile every rank of a live job for a few seconds: where each step's time goes")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=_pid, help="the job: its launcher or any rank (every rank is traced)")
    target.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        nargs="+",
        help="summarise existing torch.profiler Chrome traces (files or a directory)",
    )
    window = p.add_mutually_exclusive_group()
    window.add_argument(
        "--seconds", type=_positive_float, default=None, metavar="S", help="length of the profiled window, at most 10 (default 5)"
    )
    window.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="profile N steps (batches the training loop draws) instead (bounded by 10 s)",
    )
    p.add_argument("-o", "--output", metavar="DIR", help="where the per-rank traces go (default ./gputop-trace-TIME)")
    p.add_argument(
        "--with-stack",
        action="store_true",
        help="record Python stacks too (names the function around each sync; slows the job during the window)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _add_report_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop report`'s options."""
    p = sub.add_parser("report", help="observe for a while and write a ticket-ready report")
    _add_pid(p)
    _add_simulate(p)
    p.add_argument("--seconds", type=_positive_float, default=30.0, metavar="S", help="how long to observe (default 30)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of standard output")
    p.add_argument("--format", choices=["md", "json"], default="md")
    p.add_argument("--bench", action="store_true", help="include a loader benchmark (passive; active with --yes)")
    p.add_argument("--yes", action="store_true", help="with --bench: allow injecting the benchmark agent")
    p.add_argument(
        "--trace",
        action="store_true",
        help="also profile every rank for 5 s with torch.profiler (injects an agent) and add its findings",
    )
    p.add_argument("--trace-dir", metavar="DIR", default=None, help="with --trace: where the per-rank traces go")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="build the report from a recording instead")
    p.add_argument(
        "--job",
        metavar="ID",
        help="the job to report on: with --from, of a recording that follows several jobs, its launcher's PID; "
        "with --prometheus, its `job` label (default: the job with the most ranks)",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="report on one job across nodes from what each node's `gputop serve` exported to this Prometheus",
    )
    p.add_argument(
        "--slurm-job",
        metavar="ID",
        help="with --prometheus: the Slurm job to report on (its nodes from squeue/scontrol, its job label from them)",
    )
    _add_interval(p)


def _add_check_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop check`'s options."""
    p = sub.add_parser(
        "check",
        help="quick health check before an infra ticket: one line per check; exit 0 healthy, 3 infra, 4 config",
        description=(
            "Checks the machine without disturbing it: PCIe link and error counters, AER, NVLink, topology, "
            "GPU/NIC NUMA affinity, NVSwitch fabric, ECC, remaps, retired pages, XIDs with NVIDIA's action (NVML and "
            "the kernel log), modes, clocks; --dcgm adds DCGM's diagnostics. "
            "Exit status: 0 healthy, 3 an infrastructure problem, 4 a configuration warning, 1 gputop failed, 2 bad usage."
        ),
    )
    _add_simulate(p)
    p.add_argument("--json", action="store_true", help="print every check with its status as JSON")
    p.add_argument("--seconds", type=_positive_float, default=10.0, metavar="S", help="how long the check takes (default 10)")
    p.add_argument(
        "--load",
        action="store_true",
        help="only on idle GPUs: run a short load so the links train up, and with torch a short all-reduce "
        "whose bus bandwidth is compared with the topology's (adds up to ~60 s; needs a real GPU)",
    )
    p.add_argument(
        "--dcgm",
        nargs="?",
        const=1,
        type=int,
        choices=(1, 2),
        metavar="1|2",
        help="also run NVIDIA DCGM's diagnostics (dcgmi diag -r N: 1 takes seconds, 2 about 2 minutes with PCIe and "
        "memory tests; GPUs idle) and fold each test into the lines and the exit status; default level 1",
    )
    p.add_argument("--host-root", default=None, help=argparse.SUPPRESS)  # tests: read /sys, /proc and /dev/kmsg under here


def _add_serve_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`gputop serve`'s options."""
    p = sub.add_parser("serve", help="an OpenMetrics endpoint for Prometheus (job-level signals beside dcgm-exporter)")
    p.add_argument(
        "--listen",
        default="127.0.0.1:9401",
        metavar="HOST:PORT",
        help="address to serve /metrics on (default 127.0.0.1:9401, loopback only; 0.0.0.0:PORT must be asked for)",
    )
    _add_followed_pids(p, "export")
    _add_simulate(p)
    _add_interval(p)
    p.add_argument(
        "--hostname",
        metavar="NAME",
        help="the Hostname label of every metric (default: this machine's name; containers and tests set it)",
    )
    p.add_argument(
        "--dcgm-fields",
        action="store_true",
        help="also export utilization, memory, power, temperature and SM clock (for machines without dcgm-exporter)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gputop",
        description=(
            "Terminal monitor for multi-GPU training. Tells a starving DataLoader, a straggling rank or "
            "a hang (your code) from a degraded PCIe link, throttling or ECC errors (the machine)."
        ),
        epilog="Run `gputop demo` for a simulated 8-GPU machine driven by a real PyTorch job.",
    )
    parser.add_argument("--version", action="version", version=f"gputop {__version__}")
    _add_pid(parser)
    _add_simulate(parser)
    _add_interval(parser)
    parser.set_defaults(command="tui")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("tui", help="the live monitor (the default when no command is given)")
    _add_pid(p)
    _add_simulate(p)
    _add_interval(p)

    p = sub.add_parser("snapshot", help="take one sample and print it (a table, or --json)")
    _add_pid(p)
    _add_simulate(p)
    p.add_argument("--json", action="store_true", help="print JSON (keys: host, gpus, topology, simulated[, job])")
    p.add_argument("--help-faults", action="store_true", help="list the simulated fault switches and exit")

    _add_demo_command(sub)
    _add_bench_command(sub)
    _add_trace_command(sub)
    _add_report_command(sub)
    _add_check_command(sub)

    p = sub.add_parser("record", help="write the snapshot stream to a file (compressed, append-only)")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    _add_followed_pids(p, "record")  # as serve's: a recording holds what serve exports with the same options
    _add_simulate(p)
    p.add_argument("--seconds", type=_positive_float, default=None, metavar="S", help="stop after S seconds")
    _add_interval(p)

    p = sub.add_parser("replay", help="play a recording in the TUI, with pause, seek and speed")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--speed", type=_positive_float, default=1.0, help="playback speed (default 1)")

    _add_serve_command(sub)

    p = sub.add_parser("fleet", help="one job across nodes, live: what every node's `gputop serve` exported to Prometheus")
    p.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus that scrapes every node's gputop serve")
    p.add_argument("--job", metavar="ID", help="the job's `job` label (default: the job with the most ranks; j picks another)")
    p.add_argument(
        "--slurm-job", metavar="ID", help="the Slurm job to follow (its nodes from squeue/scontrol, its job label from them)"
    )
    p.add_argument(
        "--interval", type=_positive_float, default=5.0, metavar="SECONDS", help="read Prometheus every SECONDS (default 5)"
    )

    return parser


# Subcommand -> module that owns it; each exposes run(args) -> int.
COMMAND_MODULES = {
    "tui": "gputop.commands.tui",
    "snapshot": "gputop.commands.snapshot",
    "demo": "gputop.commands.demo",
    "bench": "gputop.commands.bench",
    "trace": "gputop.commands.trace",
    "report": "gputop.commands.report",
    "check": "gputop.commands.check",
    "record": "gputop.commands.record",
    "replay": "gputop.commands.replay",
    "serve": "gputop.commands.serve",
    "fleet": "gputop.commands.fleet",
}


def command_module(args: argparse.Namespace) -> str:
    """The module that runs the command: `report --prometheus` is the cross-node report's own (it loads none of
    the local diagnosis: ~0.3 s of a 256-node report's start)."""
    if args.command == "report" and getattr(args, "prometheus", None):
        return "gputop.commands.fleet_report"
    return COMMAND_MODULES[args.command or "tui"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        # `gputop --simulate` (no subcommand): the subparsers leave command=None
        module = importlib.import_module(command_module(args))
        return int(module.run(args) or EXIT_OK)
    except UsageError as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GputopError as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gputop snapshot | head`: the reader left; that is not our failure.
        sys.stderr.close()
        return EXIT_OK
    except Exception as exc:  # last line of defence: one line, never a traceback
        if os.environ.get("GPUTOP_DEBUG"):
            raise
        print(
            f"gputop: internal error: {type(exc).__name__}: {exc} (set GPUTOP_DEBUG=1 for the traceback and please report it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
