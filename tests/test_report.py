"""The ticket report: Markdown content, JSON parity, redaction, the atomic writer, and the commands."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import stat
import subprocess
import sys

import pytest

from gputop import __version__
from gputop.analysis.diagnosis import diagnose, verdict_line
from gputop.analysis.stack_classes import FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.errors import GputopError
from gputop.model import ProcInfo
from gputop.recording import read_recording
from gputop.report.jsonreport import render_json, sparkline
from gputop.report.markdown import render_markdown
from gputop.report.redact import REDACTED, is_secret_name, redact_cmdline, redact_env, redact_text
from gputop.report.writer import write_report
from tests.harness.histories import RankSpec, Scenario, build, cycle, record, worker_busy_frames
from tests.harness.processes import run_gputop

SECRETS = [
    "sk-proj-abcdefghijklmnopqrstuvwx",
    "hunter2-very-secret",
    "hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ012345",
    "s3cr3tPW",
    "tok-123456789",
    "wandb-key-0987654321",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
]

SECRET_ARGV = (
    "python",
    "train.py",
    f"--api-key={SECRETS[0]}",
    "--token",
    SECRETS[4],
    "--db-password",
    SECRETS[1],
    f"HF_TOKEN={SECRETS[2]}",
    f"--data=https://alice:{SECRETS[3]}@data.example.com/shards",
    f"--wandb_api_key={SECRETS[5]}",
    f"https://{SECRETS[6]}@github.com/org/repo.git",
    "--lr",
    "0.1",
)


def starved_history():
    def rank(i):
        return RankSpec(
            pid=1000 + i,
            rank=i,
            gpus=(i,),
            state=cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD, WAITING_FOR_DATA]),
            workers=lambda t, b=2000 + 10 * i: (b, b + 1),
            worker_frames=lambda t, w: worker_busy_frames(int(t)),
        )

    # utilization ramps 0..100 on GPU 0 so its percentiles are known; the others sit at 20%
    hist = build(
        Scenario(seconds=100, util=lambda g, t: float(t) if g == 0 else 20.0, ranks=[rank(i) for i in range(8)], cores=64)
    )
    return hist


def with_secret_cmdline(hist):
    """The same history, with the launcher's command line full of secrets."""
    from dataclasses import replace

    from gputop.history import History

    out = History(hist.machine, capacity=len(hist))
    for snap in hist:
        launcher = ProcInfo(100, 1, "torchrun", ("torchrun", "--nproc_per_node=8", *SECRET_ARGV[1:]))
        ranks = tuple(replace(r, proc=replace(r.proc, cmdline=SECRET_ARGV)) for r in snap.job.ranks)
        out.append(replace(snap, job=replace(snap.job, launcher=launcher, ranks=ranks)))
    return out


@pytest.fixture(scope="module")
def starved():
    hist = starved_history()
    return hist, diagnose(hist, window=None)  # as `gputop report` diagnoses: everything it observed


def test_topology_section_has_the_nic_rows_and_legend_as_nvidia_smi_prints_them(starved):
    import copy

    from tests.harness.histories import make_machine

    hist = copy.copy(starved[0])
    hist.machine = make_machine()  # 8 GPUs with a rail NIC on each GPU's switch
    md = render_markdown(hist, [], command=["gputop", "report"])
    section = md[md.index("## Topology") : md.index("## Health")]
    assert "GPU0   X       NV18" in section and re.search(r"GPU7 +NIC0 +NIC1 .* NIC7 +CPU affinity", section)
    assert re.search(r"^GPU0 .*NV18\s+PIX\s+NODE\s+NODE\s+NODE\s+SYS", section, re.M)
    assert re.search(r"^NIC7 +SYS .* X\s*$", section, re.M)
    assert "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n" in section and "  NIC7: mlx5_7" in section


class FakeBench:
    def to_dict(self):
        return {
            "pid": 1000,
            "consumption": {"batches_per_s": 12.2, "wait_fraction": 0.49},
            "passive": {"wait_fraction": 0.5},
            "configs": [
                {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "batches_per_s": 12.4},
                {"num_workers": 8, "prefetch_factor": 4, "pin_memory": True, "batches_per_s": 47.9},
            ],
            "recommendation": {"num_workers": 8, "prefetch_factor": 4, "pin_memory": True},
            "notes": ["IterableDataset: not tried"],
        }

    def summary_lines(self):
        return ["Loader benchmark — PID 1000 (active, 15.0s)", "Verdict: the loader is the bottleneck"]


# ---------------------------------------------------------------- Markdown


def test_markdown_has_every_section_and_the_verdict(starved):
    hist, findings = starved
    md = render_markdown(hist, findings, command=["gputop", "report", "--pid", "1000"])
    for heading in (
        "# gputop report: trainbox",
        "## Findings",
        "## Machine",
        "## Topology",
        "## Health",
        "## GPU statistics",
        "## Host",
        "## Job",
        "## Top stacks",
        "## About this report",
    ):
        assert f"\n{heading}\n" in "\n" + md, heading
    assert f"**Verdict:** {verdict_line(findings)}" in md
    assert findings[0].id == "starvation"
    assert f"| gputop | {__version__} |" in md
    assert "| Command | `gputop report --pid 1000` |" in md
    assert "GPU0   X       NV18" in md  # the topology matrix, in a code block
    # job tree: ranks -> GPUs with their input wait
    assert re.search(r"\| 0 \| 0 \| 1000 \| 0 \| — \| .* \| 80% \(68–89%\) of 51 \|", md)
    # top aggregated stacks: the waiting stack with its share
    assert "dumps (80%), waiting for data" in md
    assert "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:701)" in md
    assert "| `ImageFile.load (PIL/ImageFile.py)` | 16/16 |" in md


def test_markdown_gpu_statistics_and_sparklines(starved):
    hist, findings = starved
    md = render_markdown(hist, findings)
    row = next(line for line in md.splitlines() if line.startswith("| 0 | 50% |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["0", "50%", "5%", "95%"]  # 0..100 ramp: mean 50, p5 5, p95 95
    assert cells[4] == "`▁▁▁▁▁▂▂▂▂▂▃▃▃▃▃▄▄▄▄▄▅▅▅▅▅▆▆▆▆▆▇▇▇▇▇█████`"
    flat = next(line for line in md.splitlines() if line.startswith("| 1 | 20% |"))
    assert "`▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂▂`" in flat


def test_sparkline_uses_a_fixed_scale():
    assert sparkline([50, 51, 50], 0, 100) == "▅▅▅"  # not full-height bars for a flat line
    assert sparkline([0, None, 100], 0, 100) == "▁ █"
    assert len(sparkline(list(range(1000)), 0, 1000, width=40)) == 40


def test_findings_render_evidence_frames_and_fix_as_code(starved):
    hist, findings = starved
    md = render_markdown(hist, findings)
    top = findings[0]
    assert f"> {top.summary}" in md
    for line in top.evidence:
        assert f"- {line}" in md
    frames_block = "```text\n" + "\n".join(top.frames) + "\n```"
    assert frames_block in md
    fix_first, *fix_code = top.fix.splitlines()
    assert f"**Fix:** {fix_first}" in md
    assert "```python\n" + "\n".join(fix_code) + "\n```" in md
    # fences are balanced, so the paste renders
    assert md.count("```") % 2 == 0


def test_benchmark_section(starved):
    hist, findings = starved
    md = render_markdown(hist, findings, bench=FakeBench())
    assert "## Loader benchmark" in md and "Verdict: the loader is the bottleneck" in md
    assert "| 8 | 4 | True | 47.9 |" in md
    assert "DataLoader(dataset, ..., num_workers=8, prefetch_factor=4, pin_memory=True)" in md
    data = json.loads(render_json(hist, findings, bench=FakeBench()))
    assert data["benchmark"]["result"]["configs"][1]["batches_per_s"] == 47.9


def test_no_job_and_no_gpu_report_still_renders():
    hist = build(Scenario(seconds=5, gpu_error="no NVIDIA driver found (libnvidia-ml.so.1 not loadable)", attach=False))
    md = render_markdown(hist, diagnose(hist))
    assert "| GPUs | no NVIDIA driver found (libnvidia-ml.so.1 not loadable) |" in md
    assert "No job attached" in md and "## Health" not in md


# ---------------------------------------------------------------- JSON parity


def test_json_carries_the_same_content(starved):
    hist, findings = starved
    text = render_json(hist, findings, command=["gputop", "report", "--format", "json"], generated=123.0)
    data = json.loads(text)
    md = render_markdown(hist, findings, command=["gputop", "report", "--format", "json"], generated=123.0)
    assert data["verdict"] == verdict_line(findings)
    assert [f["id"] for f in data["findings"]] == [f.id for f in findings]
    assert data["findings"][0]["evidence"] == list(findings[0].evidence)
    assert data["gputop"] == {
        "version": __version__,
        "command": "gputop report --format json",
        "python": data["gputop"]["python"],
    }
    # every finding, every GPU statistic and every rank in the JSON is in the Markdown too
    for f in data["findings"]:
        assert f["summary"] in md and all(e in md for e in f["evidence"])
    for g in data["gpus"]:
        u = g["utilization"]
        assert f"| {g['index']} | {u['mean']:.0f}% | {u['p5']:.0f}% | {u['p95']:.0f}% | `{u['spark']}` |" in md
    for r in data["job"]["ranks"]:
        assert f"| {r['rank']} | {r['local_rank']} | {r['pid']} |" in md
    assert data["machine"]["hostname"] == "trainbox" and data["topology"]["matrix"][0][1] == "NV18"
    assert data["observed"]["snapshots"] == len(hist)
    assert data["stacks"]["main_threads"][0]["state"] == WAITING_FOR_DATA


def test_xids_in_the_health_table_and_the_json():
    from tests.harness.histories import simulated_history

    hist = simulated_history("h100-sxm-8+xid=1:79@5+xid=1:48@10", seconds=15)
    findings = diagnose(hist)
    data = json.loads(render_json(hist, findings))
    xids = data["health"][1]["xids"]
    assert [(x["code"], x["label"]) for x in xids] == [
        (79, "infrastructure (file a ticket)"),
        (48, "infrastructure (file a ticket)"),
    ]
    assert xids[0]["timestamp"] < xids[1]["timestamp"] and data["health"][0]["xids"] == []
    md = render_markdown(hist, findings)
    row = next(line for line in md.splitlines() if line.startswith("| 1 | 00000000:2A:00.0 |"))
    assert "79 (GPU has fallen off the bus), 48 (double-bit ECC error (uncorrectable memory error))" in row
    assert findings[0].id == "xid" and findings[0].summary == "XIDs 79, 48 on GPU 1"


# ---------------------------------------------------------------- redaction


def test_redact_cmdline_hides_every_secret_and_keeps_the_rest():
    out = redact_cmdline(SECRET_ARGV)
    joined = " ".join(out)
    for secret in SECRETS:
        assert secret not in joined
    assert out[:2] == ("python", "train.py")
    assert "--api-key=[REDACTED]" in out and out[out.index("--token") + 1] == REDACTED
    assert "HF_TOKEN=[REDACTED]" in out
    assert "--data=https://alice:[REDACTED]@data.example.com/shards" in out
    assert "https://[REDACTED]@github.com/org/repo.git" in out
    assert out[-2:] == ("--lr", "0.1")


@pytest.mark.parametrize(
    "name,secret",
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("--api-key", True),
        ("--token", True),
        ("MYSECRETTHING", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("--monkey", False),
        ("--lr", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("KEYBOARD", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_redact_env_and_text():
    env = {
        "HF_TOKEN": "x",
        "RANK": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "MLFLOW_TRACKING_URI": "https://u:pw@mlflow.local",
        "PASSWORD_FILE": "/x",
    }
    assert redact_env(env) == {
        "HF_TOKEN": REDACTED,
        "RANK": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "MLFLOW_TRACKING_URI": "https://u:[REDACTED]@mlflow.local",
        "PASSWORD_FILE": REDACTED,
    }
    assert redact_env(env, only=["RANK", "HF_TOKEN", "MISSING"]) == {"RANK": "0", "HF_TOKEN": REDACTED}
    text = "bash -c 'WANDB_API_KEY=abc123 python t.py --token xyz --lr 0.1' curl -H 'Authorization: Bearer eyJabc.defghijkl.mnopqrstuv' https://s3/x?sig=abc&X-Amz-Credential=zzz&part=1"
    red = redact_text(text)
    for secret in ("abc123", "xyz", "eyJabc", "sig=abc", "zzz"):
        assert secret not in red
    assert "--lr 0.1" in red and "part=1" in red


def test_report_never_leaks_secrets_from_command_lines(starved):
    hist = with_secret_cmdline(starved[0])
    findings = diagnose(hist)
    argv = ["gputop", "report", "--pid", "1000", f"--api-key={SECRETS[0]}"]
    md = render_markdown(hist, findings, command=argv)
    js = render_json(hist, findings, command=argv)
    for secret in SECRETS:
        assert secret not in md and secret not in js
    assert "--lr 0.1" in md  # the rest of the command line is kept
    data = json.loads(js)
    assert data["job"]["launcher"]["cmdline"][0] == "torchrun"
    assert "environ" not in js.lower()  # never a whole environment


# ---------------------------------------------------------------- atomic writer


def test_write_report_replaces_atomically(tmp_path):
    path = tmp_path / "r.md"
    write_report(str(path), "first\n")
    write_report(str(path), "second ▁█\n")
    assert path.read_text() == "second ▁█\n"
    assert os.listdir(tmp_path) == ["r.md"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_disk_full_leaves_the_old_report_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "r.md"
    path.write_text("old report\n")

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", enospc)
    with pytest.raises(GputopError, match=r"cannot write report to .*r\.md: No space left on device \(the disk is full") as exc:
        write_report(str(path), "new report\n" * 1000)
    monkeypatch.undo()
    assert "\n" not in str(exc.value)
    assert path.read_text() == "old report\n"
    assert os.listdir(tmp_path) == ["r.md"]


def test_failed_rename_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "r.md"

    def eacces(src, dst):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", eacces)
    with pytest.raises(GputopError, match="Permission denied"):
        write_report(str(path), "x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "path,message",
    [
        ("/sys/gputop-report.md", "Permission denied (you cannot write there"),  # sysfs refuses even root
        ("/nonexistent-dir/r.md", "No such file or directory (the directory does not exist"),
        ("/tmp", "it is a directory"),
    ],
)
def test_unwritable_targets_are_one_line_errors(path, message):
    with pytest.raises(GputopError) as exc:
        write_report(path, "x")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_device_is_written_in_place_and_a_full_one_is_a_one_line_error():
    before = os.stat("/dev/full")
    with pytest.raises(GputopError) as exc:
        write_report("/dev/full", "report\n")
    assert str(exc.value) == (
        "cannot write report to /dev/full: No space left on device (the disk is full; free some space or write elsewhere with -o)"
    )
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    write_report("/dev/null", "report\n")  # a device that takes it: written, still the device
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_in_place(tmp_path):
    import threading

    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    try:
        write_report(str(fifo), "# report · ▁█\n")
    finally:
        reader.join(timeout=30)
    assert got == ["# report · ▁█\n".encode()] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["report.fifo"]  # no temp file beside it


@pytest.mark.parametrize("redirect", ["truncate", "append"])
def test_dev_stdout_writes_to_the_callers_stdout_and_keeps_the_link(spawn, tmp_path, redirect):
    out = tmp_path / "out.md"
    out.write_text("earlier line\n")
    link = os.readlink("/dev/stdout")
    with open(out, "w" if redirect == "truncate" else "a") as stdout:
        proc = spawn(
            [sys.executable, "-c", "from gputop.report.writer import write_report; write_report('/dev/stdout', '# report ·\\n')"],
            stdout=stdout,
            stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.read_text() == ("" if redirect == "truncate" else "earlier line\n") + "# report ·\n"
    assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == link


@pytest.mark.slow  # spawns processes for over a second: the full suite, not the quick lane
def test_report_is_utf8_under_an_ascii_locale(spawn):
    """LANG=C without PEP 538 coercion or UTF-8 mode: Python's stdout is ASCII, the report still prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8") and not k.startswith("LC_")}
    env.update(LANG="C", LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    check = spawn([sys.executable, "-c", "import sys; print(sys.stdout.encoding)"], stdout=subprocess.PIPE, env=env)
    assert check.communicate(timeout=30)[0].strip().lower() in (b"ascii", b"ansi_x3.4-1968")  # the setting bites
    for args, expect in (
        (["report", "--simulate", "--seconds", "1", "--interval", "0.5"], "· confidence"),
        (["snapshot", "--simulate"], "h100-sxm-8"),
    ):
        proc = spawn([sys.executable, "-m", "gputop", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and b"Traceback" not in err, err
        assert expect in out.decode("utf-8")


# ---------------------------------------------------------------- the commands, as a user runs them


gputop = functools.partial(run_gputop, timeout=60)


def test_report_from_a_recording(spawn, tmp_path, starved):
    hist, findings = starved
    rec = tmp_path / "run.gtr"
    record(rec, hist.machine, hist)
    out_md = tmp_path / "out" / "report.md"
    out_md.parent.mkdir()
    rc, out, err = gputop(spawn, "report", "--from", str(rec), "-o", str(out_md))
    assert rc == 0, err
    md = out_md.read_text()
    assert f"**Verdict:** {verdict_line(findings)}" in md
    assert f"wrote {out_md}: Input-bound" in err
    rc, out, err = gputop(spawn, "report", "--from", str(rec), "--format", "json")
    assert rc == 0 and json.loads(out)["verdict"] == verdict_line(findings)


def test_report_from_a_truncated_recording_warns_and_reports(spawn, tmp_path, starved):
    hist, _ = starved
    rec = tmp_path / "run.gtr"
    record(rec, hist.machine, hist)
    rec.write_bytes(rec.read_bytes()[:-5])
    rc, out, err = gputop(spawn, "report", "--from", str(rec))
    assert rc == 0 and out.startswith("# gputop report: trainbox")
    assert err.count("\n") == 1 and "warning: recording" in err and "damaged (truncated" in err


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["report", "--from", "/nonexistent.gtr"], 1, "no recording at /nonexistent.gtr"),
        (["report", "--bench", "--simulate"], 2, "--bench needs --pid PID"),
        (["report", "--from", "/x.gtr", "--bench"], 2, "--bench needs a live job"),
        (["report", "--simulate", "--seconds", "1", "-o", "/sys/r.md"], 1, "cannot write report to /sys/r.md"),
        (["replay", "/nonexistent.gtr"], 1, "no recording at /nonexistent.gtr"),
        (["record", "-o", "/dev/full", "--simulate", "--seconds", "1"], 1, "No space left on device"),
    ],
)
def test_bad_input_is_one_line(spawn, args, code, message):
    rc, out, err = gputop(spawn, *args)
    assert rc == code, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow  # two whole commands, each watching the simulated machine for seconds
def test_report_and_record_on_the_simulated_machine(spawn, tmp_path):
    rc, out, err = gputop(spawn, "report", "--simulate", "h100-sxm-8+thermal=2", "--seconds", "2", "--interval", "0.5")
    assert rc == 0, err
    assert "Thermal throttling on GPU 2" in out and "on a **simulated** machine (h100-sxm-8+thermal=2)" in out
    assert "observing" not in err  # no progress bar when stderr is not a terminal
    rec = tmp_path / "sim.gtr"
    rc, out, err = gputop(spawn, "record", "-o", str(rec), "--simulate", "--seconds", "2", "--interval", "0.5")
    assert rc == 0, err
    machine, snaps, warning = read_recording(str(rec))
    assert warning is None and machine.simulated and len(snaps) >= 4
    assert len(snaps[0].gpus) == 8
    assert f"recorded {len(snaps)} snapshots" in err


# ---------------------------------------------------------------- the observation loop and the replay wiring


class TickClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_observe_polls_every_interval_with_a_progress_bar_on_a_terminal():
    import io

    from gputop.commands.observing import Progress, observe
    from gputop.model import HostSample, Snapshot
    from tests.harness.histories import machine as test_machine

    clock = TickClock()

    class Source:
        machine = test_machine()

        def poll(self):
            clock.now += 0.1  # a poll takes time; the cadence stays on the interval
            return Snapshot(timestamp=clock.now, host=HostSample(cpu_percent=(10.0,)))

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    hist = observe(Source(), 5.0, 1.0, progress=Progress(stream, "observing"), clock=clock, sleep=clock.sleep)
    assert [round(s.timestamp, 1) for s in hist] == [0.1, 1.1, 2.1, 3.1, 4.1, 5.1]
    out = stream.getvalue()
    assert "observing ███" in out and "100% 5/5 s" in out and out.endswith("\r\x1b[K")
    quiet = io.StringIO()
    observe(Source(), 1.0, 1.0, progress=Progress(quiet, "observing"), clock=clock, sleep=clock.sleep)
    assert quiet.getvalue() == ""  # not a terminal: no bar in logs


def test_replay_command_hands_the_recording_to_the_tui(tmp_path, monkeypatch, starved):
    import gputop.tui.app as app
    from gputop.cli import build_parser
    from gputop.commands import replay
    from gputop.recording import ReplaySource

    hist, _ = starved
    path = tmp_path / "run.gtr"
    record(path, hist.machine, hist)
    calls = {}

    def fake_run_app(source, **kwargs):
        calls.update(source=source, **kwargs)
        return 0

    monkeypatch.setattr(app, "run_app", fake_run_app)
    assert replay.run(build_parser().parse_args(["replay", str(path), "--speed", "4"])) == 0
    source = calls["source"]
    assert isinstance(source, ReplaySource) and calls["controls"] is source
    assert source.speed == 4.0 and calls["interval"] == 0.25 and source.duration == 100.0
    assert calls["subtitle"] == "replay of run.gtr (100 s, 4×)"
