"""The cache soak: several pods over one tightly capped node cache, under faults.

Pods (``benchmarks/soak_pod.py``, each PID 1 of its own PID namespace where
``unshare --pid --fork --mount-proc`` works, else its own session) read two datasets
on a local SeaweedFS through the fault-injecting TCP proxy (``tests/support``), with
``fastload.DataLoader`` (2 workers) over ``ShardedDataset`` and ``StreamingDataset``,
and check every byte of every sample. Meanwhile the driver, at random instants:

- SIGKILLs a pod's whole tree, then starts it again (``kills``);
- SIGSTOPs a pod's whole tree (a frozen container, a debugger) and SIGCONTs it 1 to
  ``--max-stop-s`` seconds later (``stops``);
- presses Ctrl-C (SIGINT to the pod's process group); the pod must exit within 30 s,
  and is started again;
- turns the proxy's faults on or off (resets, stalls, 503 SlowDown, truncated bodies);
- re-converts one dataset in place (new content, new checksums) under the readers;
- fills the cache's filesystem (a small tmpfs, where it can be mounted) to a few
  hundred KB free, and empties it again.

Faults counted: the proxy's injected faults, re-conversions and disk fills. Checked:
every sample's bytes (``wrong``), no unexpected exception in a pod, the cache
directory's size measured with ``du`` from outside the pods every 100 ms against the
cap (``peak``), no pod without progress (a sample or a clear refusal) for longer than
``--stall-deadline`` while it is not stopped (``longest stall``), every pod out within
60 s of being asked, and, after the last pod exits, nothing left behind
(``leftovers``: live pod processes, part files under ``tmp/``, catalog rows or data
files the catalog does not account for, entries that fail ``verify``).

    python benchmarks/soak.py --seconds 60            # the one-minute version CI runs
    python benchmarks/soak.py --seconds 1800          # the 30-minute run of docs/benchmarks.md

Exit status 0 only when every check held. The last line has this form (integers
without separators, the stall with one decimal):

    soak: <samples> samples checked, <wrong> wrong, <kills> kills, <stops> stops,
    <faults> faults, peak <bytes> of cap <bytes> bytes, longest stall <s> s, <n> leftovers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # support.faultproxy: the real TCP proxy

from soak_pod import payload  # noqa: E402
from support.faultproxy import FaultProxy  # noqa: E402

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]
DATASETS = ("alpha", "beta")


def _can(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def du(path: Path) -> int:
    """The directory's size as ``du`` sees it: the larger of apparent bytes and blocks."""
    if not path.exists():
        return 0
    sizes = []
    for args in (["du", "-sb", "--apparent-size"], ["du", "-sB1"]):
        out = subprocess.run([*args, str(path)], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout:
            sizes.append(int(out.stdout.split()[0]))
    return max(sizes, default=0)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/*/task/*/children``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            with contextlib.suppress(OSError):
                todo.extend(
                    int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()
                )
    return out


def write_dataset(url: str, name: str, version: int, args: argparse.Namespace, opts: Any) -> int:
    """Write (or re-convert in place) dataset ``name`` at ``version``; its shard size."""
    from fastload.shards.writer import ShardWriter

    rng = random.Random(f"{name}-{version}")
    per = args.samples_per_shard
    target = per * 13 * 1024  # samples of 2-24 KB: ~13 KB on average
    with ShardWriter(url, shard_size=target, storage_options=opts, overwrite=True) as w:
        for i in range(args.shards * per):
            key = f"{name}{i:05d}"
            w.write({"__key__": key, "bin": payload(name, version, key, rng.randint(2048, 24576))})
    return target


class Pod:
    def __init__(self, index: int) -> None:
        self.index = index
        self.incarnation = -1
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped_until: float | None = None
        self.clock = 0.0  # start of the current run or the last SIGCONT

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(tempfile.mkdtemp(prefix="fastload-soak-", dir=args.work))
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.kills = self.stops = self.interrupts = self.reconversions = self.fills = 0
        self.hung: list[str] = []
        self.peak = 0
        self.longest_stall = 0.0
        self.stall_pod = ""
        self._mon_stop = threading.Event()
        self.mounted = False
        self.versions = dict.fromkeys(DATASETS, 0)
        self.lock = threading.Lock()

    # -- set-up ----------------------------------------------------------------------

    def setup(self) -> None:
        from fastload.bench import LocalS3
        from fastload.cache import DiskTier

        a = self.args
        self.s3 = LocalS3(self.work / "weed").start()
        self.proxy = FaultProxy(
            ("127.0.0.1", self.s3.s3_port), stall_s=2.0, base_options=self.s3.storage_options
        ).start()
        bucket = self.s3.new_bucket()
        self.urls = {n: f"s3://{bucket}/{n}" for n in DATASETS}
        shard = 0
        for n in DATASETS:
            shard = write_dataset(self.urls[n], n, 0, a, self.s3.storage_options)
        fs = self.work / "fs"
        fs.mkdir()
        probe = DiskTier(self.work / "probe")
        meta = probe.metadata_bytes(least=True)
        probe.close()
        shutil.rmtree(self.work / "probe")
        self.cap = meta + 32 * 1024 + int(3.5 * shard)
        if a.tmpfs and os.geteuid() == 0 and shutil.which("mount"):
            size = self.cap + 8 * 2**20
            self.mounted = _can(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(fs)])
        self.cache_dir = fs / "cache"
        tier = DiskTier(self.cache_dir)
        tier.set_limit(self.cap)
        tier.close()
        self.namespaces = a.namespaces and os.geteuid() == 0 and _can([*UNSHARE, "true"])
        self.config = self.work / "config.json"
        self.config.write_text(
            json.dumps(
                {
                    "work": str(self.work),
                    "datasets": self.urls,
                    "cache_dir": str(self.cache_dir),
                    "cache_limit": self.cap,
                    "storage_options": self.proxy.storage_options,
                }
            )
        )
        self.pods = [Pod(i) for i in range(a.pods)]

    # -- pods ------------------------------------------------------------------------

    def start(self, pod: Pod) -> None:
        pod.incarnation += 1
        cmd = [sys.executable, str(HERE / "soak_pod.py"), str(self.config), str(pod.index)]
        cmd.append(str(pod.incarnation))
        if self.namespaces:
            cmd = [*UNSHARE, *cmd]
        log = open(self.logs / f"pod-{pod.index}-{pod.incarnation}.log", "wb")  # noqa: SIM115
        pod.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        pod.stopped_until = None
        pod.clock = time.time()

    def signal_tree(self, pod: Pod, sig: int) -> None:
        assert pod.proc is not None
        for pid in tree(pod.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def dump_stacks(self, pod: Pod) -> None:
        """SIGUSR1 to the pod's Python processes: faulthandler writes their stacks."""
        assert pod.proc is not None
        pids = tree(pod.proc.pid)
        for pid in pids[1:] if self.namespaces else pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)

    def kill(self, pod: Pod) -> None:
        assert pod.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pod.proc.pid, signal.SIGKILL)
        self.signal_tree(pod, signal.SIGKILL)
        pod.proc.wait()

    def interrupt(self, pod: Pod) -> None:
        assert pod.proc is not None
        # Ctrl-C in a terminal: SIGINT to every process of the pod (not to unshare(1)
        # itself, which would leave its child behind)
        pids = tree(pod.proc.pid)
        for pid in pids[1:] if self.namespaces else pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        try:
            pod.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.hung.append(
                f"pod {pod.index}.{pod.incarnation} did not exit 30 s after Ctrl-C (its stacks:"
                f" logs/pod-{pod.index}-{pod.incarnation}.log with --keep)"
            )
            self.dump_stacks(pod)
            self.kill(pod)

    # -- the monitor: du and the stall clock every 100 ms ------------------------------

    def monitor(self) -> None:
        while not self._mon_stop.wait(0.1):
            self.peak = max(self.peak, du(self.cache_dir))
            now = time.time()
            for pod in self.pods:
                if not pod.running() or pod.stopped_until is not None:
                    continue
                last = pod.clock
                path = self.work / f"progress-{pod.index}-{pod.incarnation}.json"
                with contextlib.suppress(OSError, ValueError, KeyError):
                    last = max(last, json.loads(path.read_text())["last_progress"])
                stall = now - last
                if stall > self.longest_stall:
                    self.longest_stall = stall
                    self.stall_pod = f"pod {pod.index}.{pod.incarnation}"

    # -- faults ----------------------------------------------------------------------

    def reconvert(self) -> None:
        name = "beta"
        with self.lock:
            self.versions[name] += 1
            version = self.versions[name]
        write_dataset(self.urls[name], name, version, self.args, self.s3.storage_options)

    def fill(self) -> None:
        filler = self.work / "fs" / "filler"
        if filler.exists():
            filler.unlink()
            return
        st = os.statvfs(filler.parent)
        free = st.f_bavail * st.f_frsize
        keep = self.rng.randint(64, 512) * 1024
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * max(0, free - keep))
        self.fills += 1

    def step(self, now: float) -> None:
        """One random event."""
        live = [p for p in self.pods if p.running() and p.stopped_until is None]
        choices = ["kill", "stop", "interrupt", "proxy", "reconvert"]
        if self.mounted:
            choices.append("disk")
        what = self.rng.choice(choices)
        if what in ("kill", "stop", "interrupt") and not live:
            return
        if what == "kill":
            pod = self.rng.choice(live)
            self.kill(pod)
            self.kills += 1
            self.start(pod)
        elif what == "stop":
            pod = self.rng.choice(live)
            self.signal_tree(pod, signal.SIGSTOP)
            pod.stopped_until = now + self.rng.uniform(1.0, self.args.max_stop_s)
            self.stops += 1
        elif what == "interrupt":
            pod = self.rng.choice(live)
            self.interrupt(pod)
            self.interrupts += 1
            self.start(pod)
        elif what == "proxy":
            if any(self.proxy._p.values()):
                self.proxy.set_faults()
            else:
                p = self.args.fault_rate
                seed = self.rng.randrange(2**31)
                self.proxy.set_faults(reset=p, stall=p / 3, slowdown=p, truncate=p, seed=seed)
        elif what == "reconvert":
            threading.Thread(target=self.reconvert, daemon=True).start()
            self.reconversions += 1
        elif what == "disk":
            self.fill()

    # -- the run ---------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        self.setup()
        for pod in self.pods:
            self.start(pod)
        mon = threading.Thread(target=self.monitor, daemon=True)
        mon.start()
        end = time.time() + a.seconds
        next_event = time.time() + self.rng.uniform(2.0, 4.0)
        try:
            while time.time() < end:
                now = time.time()
                for pod in self.pods:
                    if pod.stopped_until is not None and now >= pod.stopped_until:
                        self.signal_tree(pod, signal.SIGCONT)
                        pod.stopped_until = None
                        pod.clock = now
                    if pod.proc is not None and pod.proc.poll() is not None:
                        # a pod that ended by itself: record it and start another
                        self.hung.append(
                            f"pod {pod.index}.{pod.incarnation} exited by itself "
                            f"(status {pod.proc.returncode})"
                        )
                        self.start(pod)
                if now >= next_event:
                    self.step(now)
                    next_event = now + self.rng.uniform(a.event_every / 2, a.event_every * 1.5)
                time.sleep(0.05)
        finally:
            (self.work / "stop").write_text("1")
            filler = self.work / "fs" / "filler"
            if filler.exists():
                filler.unlink()
            for pod in self.pods:
                if pod.running() and pod.stopped_until is not None:
                    self.signal_tree(pod, signal.SIGCONT)
                    pod.stopped_until = None
            self.proxy.set_faults()
            for pod in self.pods:
                if pod.proc is None:
                    continue
                try:
                    pod.proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    self.hung.append(f"pod {pod.index}.{pod.incarnation} did not stop")
                    self.dump_stacks(pod)
                    self.kill(pod)
            self._mon_stop.set()
            mon.join()
        return self.finish()

    def leftovers(self) -> list[str]:
        from fastload.cache import DiskTier

        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(self.config).encode() in cmd:
                out.append(f"process {pid}")
        tmp = self.cache_dir / "tmp"
        if tmp.is_dir():
            out += [f"tmp/{n}" for n in os.listdir(tmp)]
        tier = DiskTier(self.cache_dir)
        try:
            for kind, names in tier.leftovers().items():
                out += [f"{kind}: {n}" for n in names if kind != "temp_files"]
            out += [f"verify: {b}" for b in tier.verify()]
        finally:
            tier.close()
        return out

    def finish(self) -> int:
        totals = dict.fromkeys(("samples", "wrong", "refused", "unexpected"), 0)
        messages: list[str] = []
        runs = 0
        for path in sorted(self.work.glob("progress-*.json")):
            doc = json.loads(path.read_text())
            runs += 1
            for k in totals:
                totals[k] += int(doc[k])
            messages += [f"{path.stem}: {m}" for m in doc["messages"]]
        left = self.leftovers()
        faults = sum(self.proxy.stats.faults.values()) + self.reconversions + self.fills
        a = self.args
        print(
            f"soak: {len(self.pods)} pods ({'PID namespaces' if self.namespaces else 'sessions'}),"
            f" {runs} pod runs, {self.interrupts} Ctrl-C, {self.reconversions} re-conversions,"
            f" {self.fills} disk fills ({'tmpfs' if self.mounted else 'no tmpfs'}), proxy faults"
            f" {dict(self.proxy.stats.faults)}, {totals['refused']} clear refusals,"
            f" {totals['unexpected']} unexpected errors; longest stall in {self.stall_pod or '-'}"
        )
        for m in messages[:20]:
            print("  " + m.replace("\n", "\n    "))
        for h in self.hung:
            print("  " + h)
        for item in left[:20]:
            print("  leftover: " + item)
        ok = (
            totals["samples"] > 0
            and totals["wrong"] == 0
            and totals["unexpected"] == 0
            and not self.hung
            and self.peak <= self.cap
            and self.longest_stall <= a.stall_deadline
            and not left
        )
        print(
            f"soak: {totals['samples']} samples checked, {totals['wrong']} wrong,"
            f" {self.kills} kills,"
            f" {self.stops} stops, {faults} faults, peak {self.peak} of cap {self.cap} bytes,"
            f" longest stall {self.longest_stall:.1f} s, {len(left)} leftovers"
        )
        return 0 if ok else 1

    def cleanup(self) -> None:
        for pod in getattr(self, "pods", []):
            if pod.running():
                self.kill(pod)
        if hasattr(self, "proxy"):
            self.proxy.stop()
        if hasattr(self, "s3"):
            self.s3.stop()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.work / "fs")], capture_output=True)
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print(f"soak: work directory kept at {self.work}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--pods", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=int, default=8, help="shards per dataset")
    p.add_argument("--samples-per-shard", type=int, default=40)
    p.add_argument("--event-every", type=float, default=3.0, help="mean seconds between events")
    p.add_argument("--max-stop-s", type=float, default=15.0)
    p.add_argument("--fault-rate", type=float, default=0.03, help="per request, per fault kind")
    p.add_argument("--stall-deadline", type=float, default=60.0)
    p.add_argument("--no-tmpfs", dest="tmpfs", action="store_false")
    p.add_argument("--no-namespaces", dest="namespaces", action="store_false")
    p.add_argument("--work", default=None, help="parent of the work directory")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    soak = Soak(args)
    try:
        return soak.run()
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
