"""Process plumbing for the benchmarks: start, watch, measure and always stop child processes.

Every child runs in its own session (so its process group id is its pid) and is stopped by
signalling that group, first SIGTERM then SIGKILL. `Processes` is a context manager; leaving
it (normally, on an exception or on Ctrl-C) stops everything it started.
"""

from __future__ import annotations

import os
import resource
import ctypes
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (children inherit it); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    # The port could in theory be taken between close() and the child's bind; on a quiet
    # loopback this does not happen in practice, and wait_for_port would report it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, *, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.args!r} exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def descendants(pid: int) -> list[int]:
    """pid and every process below it (gunicorn: master and workers)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{current}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            pending.extend(int(child) for child in children)
    return found


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads, alive or ended), in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    return sum(process_cpu_seconds(member) for member in descendants(pid))


def process_runtime_seconds(pid: int) -> float:
    """Time on a CPU of every live thread of one process, from the scheduler's nanosecond
    count (/proc/<pid>/task/<tid>/schedstat). utime+stime carry the same total, but in
    10 ms ticks: too coarse for a relay at 1 % of a core. Exited threads are not counted,
    so this is for long-lived servers, read while they run."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    total_ns = 0
    for tid in threads:
        try:
            total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total_ns / 1e9


def tree_runtime_seconds(pid: int) -> float:
    return sum(process_runtime_seconds(member) for member in descendants(pid))


def process_run_delay_seconds(pid: int) -> float:
    """Time the process's live threads were runnable but waiting for a CPU (schedstat's
    second field): on a shared machine, how much the other tenants held it back."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    total_ns = 0
    for tid in threads:
        try:
            total_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total_ns / 1e9


def tree_run_delay_seconds(pid: int) -> float:
    return sum(process_run_delay_seconds(member) for member in descendants(pid))


def rss_bytes(pid: int) -> int:
    try:
        resident_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except OSError:
        return 0
    return resident_pages * PAGE_SIZE


def tree_rss_bytes(pid: int) -> int:
    return sum(rss_bytes(member) for member in descendants(pid))


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Processes:
    """Owns child processes; `stop_all()` (run on exit) ends each one's whole process group."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._children: list[Child] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: int | None = subprocess.DEVNULL,
        stdout: int | None = None,
        cwd: str | None = None,
    ) -> Child:
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")
        try:
            process = subprocess.Popen(
                list(argv),
                env=dict(env) if env is not None else None,
                stdin=stdin,
                stdout=stdout if stdout is not None else log_file,
                stderr=log_file,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log_file.close()  # the child holds its own descriptor
        child = Child(name, process, log_path)
        self._children.append(child)
        return child

    def stop(self, child: Child, *, grace: float = 5.0) -> None:
        process = child.process
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while group members live on (gunicorn worker): always
        # finish the group off.
        _signal_group(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            print(f"warning: {child.name} (pid {process.pid}) did not exit after SIGKILL", file=sys.stderr)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        if child in self._children:
            self._children.remove(child)

    def stop_all(self) -> None:
        # Latest first: load generators before services before upstreams, so nothing
        # under test logs a storm of upstream errors while shutting down.
        for child in reversed(list(self._children)):
            self.stop(child)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: if the benchmark itself is killed (SIGKILL, a tool's
    time limit), the kernel kills the child too, so nothing is left running. Linux only;
    elsewhere the process-group cleanup above is all there is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_on_sigterm() -> None:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt, so `finally` blocks stop the children."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
