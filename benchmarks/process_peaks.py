"""Peak memory of a process tree, polled (benchmarks/scale.py and long_run.py use it): `Watch`
follows a root process and its descendants, keeping each one's VmHWM and RssAnon peaks from
/proc/PID/status and a role read from its command line (cli/controller, zygote, engine or
trainer worker, Prefect server), and the peak size of the run's /dev/shm weights folder.
With `pss=True` it also reads /proc/PID/smaps_rollup: each process's peak PSS (its private
pages plus its share of pages it shares: the zygote's pages a forked worker has not written,
shared libraries, mapped model files), split at that moment into anonymous, file and shmem
PSS, and the peak of the tree's summed PSS at one poll (not the sum of peaks reached at
different times). It also samples the tree's CPU seconds (user + sys, an exited process
counted with its last value) at each poll: `cpu_between` gives them over a window.

Linux only (/proc). What it does not: start or stop anything, or report (scale.py prints).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ProcessPeak:
    pid: int
    role: str
    vmhwm_kib: int = 0
    anon_kib: int = 0  # polled peak of RssAnon: private memory (no file pages, no mapped /dev/shm)
    pss_kib: int = 0  # polled peak of Pss (smaps_rollup), with its split at that poll:
    pss_anon_kib: int = 0
    pss_file_kib: int = 0
    pss_shmem_kib: int = 0


@dataclass
class Watch:
    """VmHWM of a process tree, polled until stopped."""

    root: int
    shm_prefix: Path  # the run's weight-sync folder is the one named so plus a random suffix (workers/shm.py)
    peaks: dict[int, ProcessPeak] = field(default_factory=dict)
    shm_peak: int = 0
    pss: bool = False  # also poll /proc/PID/smaps_rollup (a page-table walk: ~ms per GiB mapped)
    interval_s: float = 0.2
    pss_sum_peak_kib: int = 0  # the largest sum of the tree's PSS at one poll
    stop: threading.Event = field(default_factory=threading.Event)
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)  # (time.time(), the tree's CPU s so far)
    _cpu_by_pid: dict[int, float] = field(default_factory=dict)  # an exited process keeps its last value

    def cpu_between(self, start: float, end: float) -> float | None:
        """CPU seconds (user + sys) of the whole tree between two time.time() instants,
        interpolated between polls; None outside the polled span."""
        at = [_interpolate(self.cpu_samples, moment) for moment in (start, end)]
        return None if None in at else at[1] - at[0]

    def run(self) -> None:
        while not self.stop.is_set():
            pss_sum = 0
            for pid in _descendants(self.root):
                cpu = _cpu_s(pid)
                if cpu is not None:
                    self._cpu_by_pid[pid] = cpu
                status = _status_kib(pid)
                if "VmHWM" not in status:
                    continue
                peak = self.peaks.get(pid)
                if peak is None:
                    peak = self.peaks[pid] = ProcessPeak(pid, _role(pid, self.root))
                elif peak.role == "cli fork":  # forked by Popen, not yet exec'd when first seen
                    peak.role = _role(pid, self.root)
                peak.vmhwm_kib = max(peak.vmhwm_kib, status["VmHWM"])
                peak.anon_kib = max(peak.anon_kib, status.get("RssAnon", 0))
                if self.pss:
                    rollup = _rollup_kib(pid)
                    pss_sum += rollup.get("Pss", 0)
                    if rollup.get("Pss", 0) > peak.pss_kib:
                        peak.pss_kib, peak.pss_anon_kib = rollup["Pss"], rollup.get("Pss_Anon", 0)
                        peak.pss_file_kib, peak.pss_shmem_kib = rollup.get("Pss_File", 0), rollup.get("Pss_Shmem", 0)
            self.cpu_samples.append((time.time(), sum(self._cpu_by_pid.values())))
            self.pss_sum_peak_kib = max(self.pss_sum_peak_kib, pss_sum)
            self.shm_peak = max(self.shm_peak, sum(map(_folder_bytes, self.shm_prefix.parent.glob(self.shm_prefix.name + "*"))))
            self.stop.wait(self.interval_s)


def run_watched(command: list[str], cwd: Path, env: dict[str, str], log: Path, shm_prefix: Path,
                **watch_options) -> tuple[int, float, Watch]:
    """Run `command` (stdout and stderr into `log`) while a Watch polls its process tree:
    its exit code, its wall time in seconds, and the Watch with the peaks."""
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        watch = Watch(process.pid, shm_prefix, **watch_options)
        thread = threading.Thread(target=watch.run, daemon=True)
        thread.start()
        returncode = process.wait()
        watch.stop.set()
        thread.join()
    return returncode, time.perf_counter() - started, watch


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files in `folder` (0 when it is gone)."""
    total = 0
    try:
        for entry in os.scandir(folder):
            try:
                total += entry.stat().st_size
            except OSError:
                pass
    except OSError:
        pass
    return total


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(root: int) -> list[int]:
    children, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """utime + stime of /proc/PID/stat in seconds (None when the process is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of stat(5), after pid and comm


def _interpolate(samples: list[tuple[float, float]], moment: float) -> float | None:
    """The value at `moment` of a list of (time, value) polls, linear between the two around it."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:]):
        if t0 <= moment <= t1:
            return v0 + (v1 - v0) * ((moment - t0) / (t1 - t0) if t1 > t0 else 0.0)
    return None


def _status_kib(pid: int) -> dict[str, int]:
    """VmHWM, RssAnon of /proc/PID/status in KiB ({} when the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {key: int(rest.split()[0]) for key, _, rest in (line.partition(":") for line in lines)
            if key in ("VmHWM", "RssAnon")}


def _rollup_kib(pid: int) -> dict[str, int]:
    """Pss, Pss_Anon, Pss_File, Pss_Shmem of /proc/PID/smaps_rollup in KiB ({} when gone)."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    return {key: int(rest.split()[0]) for key, _, rest in (line.partition(":") for line in lines)
            if key in ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")}


def _role(pid: int, root: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    text = " ".join(argv)
    if pid == root:
        return "cli/controller"
    try:
        if Path(f"/proc/{root}/cmdline").read_bytes().decode(errors="replace").split("\0") == argv:
            return "cli fork"
    except OSError:
        pass
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    if comm in ("rlpipe-engine", "rlpipe-trainer"):  # forked by the zygote: its command line is the zygote's
        return f"{comm.removeprefix('rlpipe-')} worker"
    if "rlpipe.workers.zygote" in text:
        return "zygote"
    if "rlpipe.workers.main" in text:
        return f"{argv[argv.index('--kind') + 1]} worker" if "--kind" in argv else "worker"
    if "uvicorn" in text or "prefect" in text:
        return "prefect server"
    return " ".join(Path(argv[0]).name.split() + argv[1:3])[:40]
