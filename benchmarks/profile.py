"""Where a request's microseconds go: the service of any checkout under py-spy while wrk posts
one instance per `:predict`, summed per request.

    python -m benchmarks.profile [--checkout DIR] [--label NAME] [--model fashion_mnist|tabular]
                                 [--concurrency 1,64] [--seconds 10] [--rate 200] [--native]

The checkout's service (`python -m service`, the checkout on PYTHONPATH, run with this venv's
Python as benchmarks/ab.py runs one; `git worktree add /tmp/before <commit>` makes one) serves
the model `make bench` measures (the newest CNN under this checkout's models/fashion_mnist,
or the tabular classifier of benchmarks/generic.py), one process, the defaults. At each
concurrency, after a warm-up, `py-spy record` samples every thread of the server at `--rate`
while wrk loads it, and /proc gives each thread's CPU over the same window. What is written,
per model and concurrency, into benchmarks/results/profiles/ (or `--out`):

- `<label>-<model>-c<N>.collapsed.gz`: py-spy's stacks, one line a stack with its sample
  count (flamegraph.pl's input; speedscope opens it too);
- `<label>-<model>-c<N>.json`: the run (commit, load average, requests, the server's CPU per
  request) and the summary below;
- `<label>-<model>-c<N>.txt`: the summary in words: per thread its CPU per request (from
  /proc) and its sampled time per request; per component (the leaf frame's package, or the
  project's module) and per frame, the time at the top of the stack (self); per function,
  the time under it (total). A sample is 1/rate seconds of a thread that py-spy finds
  running, so a frame's µs per request are its samples / rate / requests * 1e6.

A thread with no Python frame at that moment (the HTTP server's own threads, the native
code of a C extension) is one leaf, "(native)", unless `--native` unwinds it too (slower,
and py-spy must be able to read the binaries' symbols). py-spy does not always tell a thread
waiting in native code from one running: a thread's sampled time can exceed its CPU from
/proc (Granian's threads do), so the summary gives both. The docs' Benchmarks page shows the
summaries found in benchmarks/results/profiles/ (`profiles_block`, rendered by
docs/figures.py), each label side by side.

py-spy attaches with ptrace: it needs root or CAP_SYS_PTRACE.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, free_port, process_cpu_seconds, requests_done

PROFILES = ROOT / "benchmarks" / "results" / "profiles"
MODELS = ("fashion_mnist", "tabular")
# How many rows each ranking keeps in the summaries.
TOP = 15
NATIVE = "(native)"
# py-spy's thread root: "thread (1234): MainThread" (the OS thread id, the Python name if any).
THREAD = re.compile(r"^thread \((\d+)\)(?::\s*(.*))?$")
# A frame: "function (path:line)".
FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
# The project's own packages: a frame in them is named by its module, others by their package.
PROJECT = ("service", "artifact", "benchmarks", "training")


# ---- reading py-spy's stacks ------------------------------------------------------------------


def parse_collapsed(text: str) -> list[tuple[str, str, list[str], int]]:
    """py-spy's raw output (`--format raw --threads`): per stack (thread id, thread name,
    frames from the root, samples)."""
    stacks = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        match = THREAD.match(frames[0])
        tid, name = (match.group(1), match.group(2) or "") if match else ("?", "")
        stacks.append((tid, name, [f for f in frames[1:] if f], int(count)))
    return stacks


def component(frame: str) -> str:
    """What a frame belongs to: the project's module ("service/ingress.py"), else the
    top-level package or module ("asyncio", "granian", "tensorflow")."""
    if frame == NATIVE:
        return NATIVE
    match = FRAME.match(frame)
    path = match.group("path") if match else frame
    if path.startswith("<frozen "):
        return path[len("<frozen ") : -1].split(".")[0]
    parts = Path(path).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    for i, part in enumerate(parts[:-1]):
        if part in PROJECT:  # the project's module, wherever its checkout is
            return "/".join(parts[i:])
    return parts[0].removesuffix(".py") if parts else path


def function_of(frame: str) -> str:
    """A frame without its line: "Ingress._http (service/ingress.py)"."""
    match = FRAME.match(frame)
    if not match:
        return frame
    return f"{match.group('function')} ({match.group('path')})"


def summarize(stacks, rate: float, requests: int, thread_cpu: dict[str, float]) -> dict:
    """The sampled time per request by thread, component, leaf frame (self) and function
    (total), each as µs per request; with each thread's CPU per request from /proc
    (`thread_cpu`: tid -> CPU seconds over the window)."""
    per_request = 1e6 / rate / requests if requests else 0.0
    threads: dict[str, dict] = {}
    by_component: collections.Counter = collections.Counter()
    by_self: collections.Counter = collections.Counter()
    by_total: collections.Counter = collections.Counter()
    in_threads: dict[str, set[str]] = collections.defaultdict(set)
    total = 0
    for tid, name, frames, count in stacks:
        total += count
        thread = threads.setdefault(tid, {"tid": tid, "name": name, "samples": 0})
        thread["name"] = thread["name"] or name
        thread["samples"] += count
        leaf = function_of(frames[-1]) if frames else NATIVE
        by_self[leaf] += count
        by_component[component(frames[-1]) if frames else NATIVE] += count
        for function in {function_of(frame) for frame in frames}:
            by_total[function] += count
            in_threads[function].add(tid)
    # A function under which its threads spend nearly all their time (the entry point, the
    # event loop's run_forever) says nothing: the ranking by total time leaves it out.
    for function in list(by_total):
        if by_total[function] >= 0.98 * sum(threads[t]["samples"] for t in in_threads[function]):
            del by_total[function]

    def ranked(counter: collections.Counter, top: int | None = TOP) -> list[dict]:
        return [
            {"name": key, "us_per_request": count * per_request, "share": count / total}
            for key, count in counter.most_common(top)
        ]

    for tid, cpu in thread_cpu.items():
        threads.setdefault(tid, {"tid": tid, "name": "", "samples": 0})["cpu_s"] = cpu
    thread_rows = []
    for thread in threads.values():
        cpu = thread.get("cpu_s")
        if not thread["samples"] and not cpu:
            continue  # idle all along
        thread_rows.append(
            {
                "tid": thread["tid"],
                "name": thread["name"] or "(no Python name)",
                "sampled_us_per_request": thread["samples"] * per_request,
                "cpu_us_per_request": None if cpu is None or not requests else cpu / requests * 1e6,
            }
        )
    thread_rows.sort(key=lambda row: -(row["cpu_us_per_request"] or row["sampled_us_per_request"]))
    return {
        "samples": total,
        "sampled_us_per_request": total * per_request,
        "threads": thread_rows,
        "components": ranked(by_component, None),
        "self": ranked(by_self),
        "total": ranked(by_total),
    }


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """tid -> that thread's user and system CPU seconds."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[task] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per thread, the CPU used between two reads (a thread started meanwhile from zero)."""
    return {tid: after[tid] - before.get(tid, 0.0) for tid in after}


# ---- the summary in words ---------------------------------------------------------------------


def summary_text(profile: dict) -> str:
    """A run's summary as the .txt file holds it."""
    run, summary = profile["run"], profile["summary"]
    lines = [
        f"Profile of one :predict ({profile['model']}, one instance a request, wrk c="
        f"{run['concurrency']}), label {profile['label']!r}",
        f"checkout {run['checkout']} at {run['commit']}; {run['date']}; py-spy {run['py_spy']} "
        f"at {run['rate']:g} Hz for {run['seconds']} s",
        f"{run['cores']} cores; load average (1 minute) {run['loadavg_at_start']:.1f} before "
        f"the service started, {run['loadavg_before']:.1f} when the profile began and "
        f"{run['loadavg_after']:.1f} at its end (the server and wrk add about 2 themselves)",
        f"{run['requests']:,} requests, {run['requests_per_s']:,.0f}/s; the server's CPU (all "
        f"its threads, /proc): {run['cpu_us_per_request']:,.0f} µs/request; sampled by py-spy: "
        f"{summary['sampled_us_per_request']:,.0f} µs/request",
        "",
        "By thread (CPU from /proc; sampled: the time py-spy found it running), µs/request:",
    ]
    for thread in summary["threads"]:
        cpu = thread["cpu_us_per_request"]
        lines.append(
            f"  {'-' if cpu is None else f'{cpu:8,.0f}'}  {thread['sampled_us_per_request']:8,.0f}"
            f"  thread {thread['tid']} {thread['name']}"
        )
    for title, key in (
        ("By component (the frame at the top of the stack)", "components"),
        ("Top frames by self time", "self"),
        (
            "Top functions by total time (the time under them; not those its threads spend "
            "nearly all their time under: entry points, the event loop's run_forever)",
            "total",
        ),
    ):
        lines += ["", f"{title}, µs/request and share of the samples:"]
        lines += [
            f"  {row['us_per_request']:8,.1f}  {row['share']:6.1%}  {row['name']}"
            for row in summary[key]
        ]
    return "\n".join(lines) + "\n"


# ---- the Benchmarks page's block --------------------------------------------------------------

# The components shown per model and concurrency on the Benchmarks page (the largest).
PAGE_COMPONENTS = 10


def read_profiles(directory: Path = PROFILES) -> list[dict]:
    """Every summary under `directory`, oldest run first."""
    profiles = [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]
    for profile, path in zip(profiles, sorted(directory.glob("*.json")), strict=True):
        profile["file"] = path.with_suffix(".txt").name
    return sorted(profiles, key=lambda p: p["run"]["date"])


def profiles_block(directory: Path = PROFILES) -> str:
    """The Benchmarks page's profiles: per model and concurrency, each label's run side by
    side (requests/s, the server's CPU and the sampled time per request, the largest
    components), and where its whole summary is."""
    profiles = read_profiles(directory) if directory.is_dir() else []
    if not profiles:
        return (
            "No profile is recorded yet. `python -m benchmarks.profile --label after` records "
            "this checkout's; `--checkout DIR --label before` another checkout's (see above)."
        )
    groups: dict[tuple[str, int], list[dict]] = {}
    for profile in profiles:
        groups.setdefault((profile["model"], profile["run"]["concurrency"]), []).append(profile)
    lines: list[str] = []
    for (model, concurrency), group in sorted(groups.items()):
        header = [f"{p['label']} ({p['run']['commit']}, {p['run']['date']})" for p in group]
        lines += [
            f"**{model}, c={concurrency}**, one instance a request, µs per request:",
            "",
            "| | " + " | ".join(header) + " |",
            "|---|" + "---:|" * len(group),
        ]

        def row(title: str, cells: list[str], lines: list[str] = lines) -> None:
            lines.append(f"| {title} | " + " | ".join(cells) + " |")

        row("requests/s", [f"{p['run']['requests_per_s']:,.0f}" for p in group])
        row("load average before the run (cores)",
            [f"{p['run']['loadavg_at_start']:.1f} ({p['run']['cores']})"
             for p in group])  # fmt: skip
        row("server CPU, all threads (/proc)",
            [f"{p['run']['cpu_us_per_request']:,.0f}" for p in group])  # fmt: skip
        row("sampled by py-spy", [f"{p['summary']['sampled_us_per_request']:,.0f}" for p in group])
        largest: collections.Counter = collections.Counter()
        for p in group:
            for entry in p["summary"]["components"]:
                largest[entry["name"]] = max(largest[entry["name"]], entry["us_per_request"])
        for name, _ in largest.most_common(PAGE_COMPONENTS):
            cells = []
            for p in group:
                found = {e["name"]: e["us_per_request"] for e in p["summary"]["components"]}
                cells.append(f"{found[name]:,.0f}" if name in found else "-")
            row(f"… of which `{name}`", cells)
        files = ", ".join(f"`benchmarks/results/profiles/{p['file']}`" for p in group)
        lines += ["", f"Every frame: {files}.", ""]
    return "\n".join(lines).rstrip()


# ---- running it -------------------------------------------------------------------------------


def commit_of(checkout: Path) -> str:
    """The checkout's short commit, "+changes" when its tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def model_and_body(model: str, workdir: Path) -> tuple[dict, Path, str]:
    """The service's model variables, a one-instance body and the :predict path."""
    from benchmarks.generic import served_model

    served = served_model(model, workdir)
    return served.environment, served.body, served.path


def start_service(checkout: Path, model_env: dict, log_path: Path) -> tuple[subprocess.Popen, int]:
    """The checkout's `python -m service` on a free port, once /readyz answers 200."""
    import httpx

    port = free_port()
    env = {**os.environ, **model_env, "PYTHONPATH": str(checkout), "PORT": str(port),
           "GRPC_PORT": "0", "LOG_LEVEL": "warning", "MODEL_POLL_SECONDS": "0"}  # fmt: skip
    env.pop("WORKERS", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=checkout, env=env,
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the service was not ready within 180 s: {log_path.read_text()[-2000:]}")


def wrk(port: int, body: Path, path: str, concurrency: int, seconds: float) -> str:
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_PATH": path}
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "-s",
               str(ROOT / "benchmarks" / "post.lua"), f"http://127.0.0.1:{port}"]  # fmt: skip
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"answers other than 200 under wrk:\n{out}")
    return out


def py_spy_version() -> str:
    out = subprocess.run([py_spy(), "--version"], capture_output=True, text=True).stdout
    return out.split()[-1] if out else "?"


def py_spy() -> str:
    """py-spy beside this interpreter (the dev venv's), or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else (shutil.which("py-spy") or "py-spy")


def profile_once(
    pid: int, port: int, body: Path, path: str, concurrency: int, seconds: int, rate: float,
    native: bool, stacks_path: Path,
) -> dict:  # fmt: skip
    """py-spy on the server while wrk loads it for `seconds`: the run's figures, py-spy's
    stacks in stacks_path.

    py-spy reads the stacks without stopping the process (`--nonblocking`): stopped at each
    sample, threads waiting on a lock (the batcher's Condition.wait) were counted as running,
    a fifth of all samples at c=1 here, and the server lost a fifth of its requests/s."""
    command = [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
               "--threads", "--nonblocking", "--duration", str(seconds + 2),
               "--output", str(stacks_path)]  # fmt: skip
    if native:
        command.append("--native")
    spy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)  # attached before the load starts
    threads_before, cpu_before = thread_cpu_seconds(pid), process_cpu_seconds(pid)
    started = time.monotonic()
    out = wrk(port, body, path, concurrency, seconds)
    elapsed = time.monotonic() - started
    threads = cpu_between(threads_before, thread_cpu_seconds(pid))
    cpu = process_cpu_seconds(pid) - cpu_before
    said = spy.communicate(timeout=seconds + 60)[0]
    if spy.returncode != 0 or not stacks_path.exists():
        raise RuntimeError(f"py-spy failed (it needs root or CAP_SYS_PTRACE):\n{said[-2000:]}")
    requests = requests_done(out)
    return {
        "concurrency": concurrency,
        "seconds": seconds,
        "rate": rate,
        "requests": requests,
        "requests_per_s": requests / elapsed,
        "cpu_us_per_request": cpu / requests * 1e6,
        "thread_cpu_s": threads,
    }


def run_profiles(args: argparse.Namespace) -> list[Path]:
    """Every model and concurrency asked for; the summaries' paths."""
    checkout = args.checkout.resolve()
    label = args.label or commit_of(checkout)
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    workdir = Path(tempfile.mkdtemp(prefix="profile-"))
    loadavg_at_start = os.getloadavg()[0]
    try:
        for model in args.model:
            model_env, body, path = model_and_body(model, workdir)
            proc, port = start_service(checkout, model_env, workdir / f"{model}.log")
            try:
                for concurrency in args.concurrency:
                    print(f"== {label}: {model}, c={concurrency}, {args.seconds} s under py-spy",
                          flush=True)  # fmt: skip
                    wrk(port, body, path, concurrency, 3)  # warm up
                    stem = f"{label}-{model}-c{concurrency}"
                    stacks_path = workdir / f"{stem}.collapsed"
                    loadavg_before = os.getloadavg()[0]
                    run = profile_once(proc.pid, port, body, path, concurrency, args.seconds,
                                       args.rate, args.native, stacks_path)  # fmt: skip
                    stacks = stacks_path.read_text()
                    profile = {
                        "label": label,
                        "model": model,
                        "run": {
                            **{k: v for k, v in run.items() if k != "thread_cpu_s"},
                            "checkout": str(checkout),
                            "commit": commit_of(checkout),
                            "date": time.strftime("%Y-%m-%d %H:%M"),
                            "cores": os.cpu_count(),
                            "loadavg_at_start": loadavg_at_start,
                            "loadavg_before": loadavg_before,
                            "loadavg_after": os.getloadavg()[0],
                            "py_spy": py_spy_version(),
                            "native": args.native,
                        },
                        "summary": summarize(
                            parse_collapsed(stacks), args.rate, run["requests"], run["thread_cpu_s"]
                        ),  # fmt: skip
                    }
                    (out_dir / f"{stem}.json").write_text(json.dumps(profile, indent=1) + "\n")
                    (out_dir / f"{stem}.txt").write_text(summary_text(profile))
                    with gzip.open(out_dir / f"{stem}.collapsed.gz", "wt") as f:
                        f.write(stacks)
                    print(summary_text(profile), flush=True)
                    written.append(out_dir / f"{stem}.txt")
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return written


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--checkout", type=Path, default=ROOT, help="the checkout to profile (default: this one)"
    )
    parser.add_argument("--label", help="names the files (default: the checkout's commit)")
    parser.add_argument("--model", choices=MODELS, action="append",
                        help="fashion_mnist, tabular, or both (the default)")  # fmt: skip
    parser.add_argument("--concurrency", default="1,64", help="comma-separated (default 1,64)")
    parser.add_argument("--seconds", type=int, default=10, help="wrk's run under py-spy")
    parser.add_argument("--rate", type=float, default=200, help="py-spy's samples per second")
    parser.add_argument("--native", action="store_true", help="unwind native frames too")
    parser.add_argument("--out", type=Path, default=PROFILES, help="where the files go")
    args = parser.parse_args(argv)
    args.model = args.model or list(MODELS)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency: expected numbers like 1,64, got {args.concurrency!r}")
    if args.label and not re.fullmatch(r"[\w.+-]+", args.label):
        parser.error(f"--label: letters, digits, . + - and _ only, got {args.label!r}")
    if not (args.checkout / "service" / "__main__.py").is_file():
        parser.error(f"--checkout: {args.checkout} has no service/__main__.py")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    for tool in ("wrk", py_spy()):
        if shutil.which(tool) is None and not Path(tool).exists():
            print(f"error: {tool} is not installed (the dev lock has py-spy; apt-get install wrk)")
            return 2
    from artifact.quiet import quiet_tensorflow

    quiet_tensorflow()
    for path in run_profiles(args):
        print(f"Wrote {path} (and its .json and .collapsed.gz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
