"""Ray Client connects: time and failures of ``soul_runtime.connect("ray://…")`` on fresh and busy heads.

Each client is its own process (one Ray Client per process, as an application has): ``connect()`` to
the head, one turn, ``close()``. Fresh heads: a new ``ray start --head`` (soul_apps.cluster.local_cluster) per
connect, so the first client also creates the runtime's actors. Busy head: one head on which another
client keeps ``inflight`` turns in flight the whole time, with clients connecting one after another.

Two variants run in the same session, interleaved on fresh heads so both see the same machine load:
``runtime`` (heads as ``start_head`` starts them: gRPC's fork handlers off, Ray's 30 s session-start wait;
``connect()`` with its 3 attempts) and ``ray-default`` (gRPC's fork handlers on, as Ray starts a head, a
10 s session-start wait, ``connect_attempts=1``: no retry in the library).

What is counted: a connect that raised is a failed connect (with how long it took to report); a client
that connected and then failed its turn or its close is counted apart ("failed after connect"); a head
whose ``ray start`` itself failed (the raylet gives up on a slow dashboard agent on a busy machine,
ray-project/ray#65983) is no connect at all: it is counted as "heads not started", with its reason, and
another head is started in its place (up to HEAD_TRIES). ``keep_logs`` copies a failed connect's head
logs (the proxy's ray_client_server.err and each session server's ray_client_server_*.err/out).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from soul_apps.cluster import local_cluster as lc

__all__ = ["run", "summarize", "table"]

Progress = Callable[[str, int, int], None]
VARIANTS = {"runtime": {"grpc_fork_handlers": False, "attempts": 3, "session_start_timeout": 30},
            "ray-default": {"grpc_fork_handlers": True, "attempts": 1, "session_start_timeout": 10}}
CLIENT_TIMEOUT_S = 300.0
HEAD_TRIES = 3
"""`ray start` attempts per head: a head that does not start is tried again (and counted apart, not as a connect)."""


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))], 2)


def _client_env(info: lc.HeadInfo, home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "ANTHROPIC_API_KEY"}
    env.update(lc.client_env(info), HOME=home, RAY_LOGGER_LEVEL="error")
    return env


def _one_client(info: lc.HeadInfo, home: str, data_dir: str, soul: str, attempts: int,
                keep_logs: str | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "soul_apps.bench.client", "one", info.client_address, data_dir,
                            soul, str(attempts)], env=_client_env(info, home), capture_output=True, text=True,
                           timeout=CLIENT_TIMEOUT_S, cwd=tempfile.gettempdir())
        out = json.loads(r.stdout.strip().splitlines()[-1])
        if "error" in out or out.get("retries"):
            out["client_stderr"] = r.stderr[-1500:]
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        out = {"error": f"client process: {type(e).__name__}", "fail_s": time.monotonic() - t0, "stage": "process"}
    out["load1"] = round(os.getloadavg()[0], 1)
    if "error" in out:
        out["head_log"] = _head_log(info)
        if keep_logs:
            out["logs"] = _keep_logs(info, keep_logs)
    return out


def _keep_logs(info: lc.HeadInfo, dest_root: str) -> str | None:
    """Copy the head's session logs (the proxy's and every per-client server's) before the head goes."""
    src = os.path.join(info.temp_dir, "session_latest", "logs")
    dest = tempfile.mkdtemp(prefix="head-", dir=os.path.abspath(dest_root))
    try:
        shutil.copytree(src, os.path.join(dest, "logs"), ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
    except (OSError, shutil.Error):
        return None
    return dest


def _head_log(info: lc.HeadInfo) -> list[str]:
    """The client proxy's own account of a failed connect (its log goes when the head is stopped)."""
    path = os.path.join(info.temp_dir, "session_latest", "logs", "ray_client_server.err")
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    keys = ("ERROR", "Check failed", "status =", "details =", "startup failed", "Timeout", "FD from")
    return [ln[:300] for ln in lines if any(k in ln for k in keys)][-20:]


def _head(state_root: str, variant: str) -> tuple[lc.HeadInfo, str]:
    sdir = tempfile.mkdtemp(prefix="st", dir=state_root)
    info = lc.start_head(num_cpus=2, resources={"soul_slot": 4}, state_dir=sdir, node_ip="127.0.0.1",
                         grpc_fork_handlers=bool(VARIANTS[variant]["grpc_fork_handlers"]),
                         session_start_timeout=int(VARIANTS[variant]["session_start_timeout"]))
    return info, sdir


def _clip(text: str, keep: int = 300) -> str:
    """The first line (what failed, and why if known) and the end (where `ray start` stopped)."""
    first, _, rest = text.partition("\n")
    return first[:keep] + (" … " + rest[-keep:] if rest else "")


def _start_head(root: str, variant: str, rows: list[dict[str, Any]], i: int) -> tuple[lc.HeadInfo, str] | None:
    """A started head, or None after HEAD_TRIES failed `ray start`s. A failed start (the machine too busy for
    Ray's own start-up) is no connect: it is recorded as a "head-failed" row, counted apart in the summary."""
    for _ in range(HEAD_TRIES):
        t0 = time.monotonic()
        try:
            return _head(root, variant)
        except RuntimeError as e:
            rows.append({"scenario": "head-failed", "variant": variant, "i": i, "head_error": _clip(str(e)),
                         "fail_s": round(time.monotonic() - t0, 1), "load1": round(os.getloadavg()[0], 1)})
    return None


def run(fresh: int = 20, busy: int = 20, *, variants: tuple[str, ...] = ("runtime", "ray-default"), inflight: int = 32,
        progress: Progress | None = None, checkpoint: str | None = None,
        keep_logs: str | None = None) -> dict[str, Any]:
    """Connect ``fresh`` clients to fresh heads and ``busy`` clients to a busy head, per variant
    (interleaved on fresh heads). ``checkpoint``: a JSON file rewritten after every connect.
    ``keep_logs``: a directory that receives a copy of the head's logs after each failed connect."""
    if keep_logs:
        os.makedirs(keep_logs, exist_ok=True)
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        raise ValueError(f"variants must be among {sorted(VARIANTS)}, got {list(variants)}")
    root = tempfile.mkdtemp(prefix="bc", dir="/tmp")
    home = os.path.join(root, "home")  # the heads' tokens live in their state dirs, not in ~/.ray
    os.makedirs(home)
    saved = {k: os.environ.pop(k) for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_ADDRESS")
             if k in os.environ}
    saved_home = os.environ.get("HOME")
    os.environ["HOME"] = home
    rows: list[dict[str, Any]] = []
    total = (fresh + busy) * len(variants)
    try:
        for i in range(fresh):
            for v in variants:
                got = _start_head(root, v, rows, i)
                if got is None:
                    continue
                info, sdir = got
                try:
                    out = _one_client(info, home, tempfile.mkdtemp(dir=root), "s0", int(VARIANTS[v]["attempts"]),
                                      keep_logs)
                finally:
                    lc.stop_head(sdir)
                rows.append(out | {"scenario": "fresh", "variant": v, "i": i})
                _checkpoint(checkpoint, rows)
                if progress:
                    progress(f"fresh heads ({v})", len(rows), total)
        for v in variants if busy else []:
            got = _start_head(root, v, rows, -1)
            if got is None:
                raise RuntimeError(f"no head for the busy scenario ({v}) started in {HEAD_TRIES} tries: "
                                   f"{rows[-1]['head_error']}")
            info, sdir = got
            data = tempfile.mkdtemp(dir=root)
            errlog = open(os.path.join(root, f"busy-{v}.err"), "w+")
            load = subprocess.Popen([sys.executable, "-m", "soul_apps.bench.client", "busy", info.client_address,
                                     data, str(inflight)], env=_client_env(info, home), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errlog, text=True, cwd=tempfile.gettempdir())
            try:
                ready = load.stdout.readline() if load.stdout else ""
                if "ready" not in ready:
                    errlog.seek(0)
                    raise RuntimeError(f"the busy client did not start: {ready!r} {errlog.read()[-2000:]} "
                                       f"(exit {load.wait(timeout=60)}; head: {_head_log(info)})")
                for i in range(busy):
                    out = _one_client(info, home, data, f"c{i}", int(VARIANTS[v]["attempts"]), keep_logs)
                    rows.append(out | {"scenario": "busy", "variant": v, "i": i})
                    _checkpoint(checkpoint, rows)
                    if progress:
                        progress(f"busy head ({v})", len(rows), total)
            finally:
                try:
                    tail = load.communicate(timeout=120)[0]  # closes its stdin: the busy client stops
                except subprocess.TimeoutExpired:
                    load.kill()
                    tail = load.communicate()[0]
                finally:
                    errlog.close()
                    lc.stop_head(sdir)
            stats = json.loads(tail.strip().splitlines()[-1]) if tail.strip() else {}
            rows.append({"scenario": "busy-load", "variant": v, **stats})
    finally:
        shutil.rmtree(root, ignore_errors=True)
        os.environ.update(saved)
        if saved_home is not None:
            os.environ["HOME"] = saved_home
    return {"rows": rows, "summary": summarize(rows), "cpus": os.cpu_count(),
            "note": "heads, clients and the busy load share this machine with whatever else runs on it"}


def _checkpoint(path: str | None, rows: list[dict[str, Any]]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"rows": rows, "summary": summarize(rows), "partial": True}, f, indent=1)


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario/variant. A head whose ``ray start`` failed is no connect: it is counted apart, as
    ``heads_not_started`` (with its error), beside the connects that were tried on heads that did start."""
    out: dict[str, dict[str, Any]] = {}

    def entry(key: str) -> dict[str, Any]:
        return out.setdefault(key, {"connects": 0, "failed": 0, "failed_after_connect": 0, "retried": 0,
                                    "slow_warned": 0, "heads_not_started": 0,
                                    "head_errors": [], "connect": [], "session": [], "turn": [], "fail_s": [],
                                    "errors": [], "load1": []})
    for r in rows:
        if r["scenario"] == "busy-load":
            continue
        if r["scenario"] == "head-failed":
            h = entry(f"{'busy' if r.get('i', 0) < 0 else 'fresh'}/{r['variant']}")
            h["heads_not_started"] += 1
            h["head_errors"].append(str(r.get("head_error", ""))[:300])
            continue
        s = entry(f"{r['scenario']}/{r['variant']}")
        s["connects"] += 1
        s["load1"].append(r.get("load1", 0.0))
        if "error" in r and r.get("stage") in ("turn", "close"):  # connected; then the turn or the close failed
            s["failed_after_connect"] += 1
            s["errors"].append(f"[{r['stage']}] {str(r['error'])[:300]}")
            s["connect"].append(r["connect_s"])
        elif "error" in r:
            s["failed"] += 1
            s["fail_s"].append(round(r.get("fail_s", 0.0), 1))
            s["errors"].append(str(r["error"])[:300])
        else:
            s["connect"].append(r["connect_s"])
            if r.get("session_s") is not None:
                s["session"].append(r["session_s"])
            s["turn"].append(r["turn_s"])
        s["retried"] += int(r.get("retries", 0) > 0)
        s["slow_warned"] += int(r.get("slow_warnings", 0) > 0)  # told at warning that the session was slow
    for s in out.values():
        c, t, ss = s.pop("connect"), s.pop("turn"), s.pop("session")
        s.update(connect_p50_s=_pct(c, 50), connect_p99_s=_pct(c, 99), connect_max_s=max(c) if c else None,
                 session_p50_s=_pct(ss, 50), session_p99_s=_pct(ss, 99),
                 turn_p50_s=_pct(t, 50), load1_median=round(statistics.median(ld), 1) if (ld := s.pop("load1")) else None)
    return out


def table(res: dict[str, Any]) -> Any:
    from rich.table import Table
    t = Table(title="Ray Client connects (each client its own process): session = the Ray Client session; "
                    "connect = soul_runtime.connect() (session + finding or creating the actors)")
    for c in ("scenario", "variant", "heads not started", "connects", "failed", "failed after connect", "retried", "slow warned", "session p50 s", "session p99 s",
              "connect p50 s", "connect p99 s", "turn p50 s", "failures took s", "load (1 min)"):
        t.add_column(c, justify="left" if c in ("scenario", "variant") else "right")
    for key, s in sorted(res["summary"].items()):
        scen, var = key.split("/")
        t.add_row(scen, var, str(s["heads_not_started"]), str(s["connects"]), str(s["failed"]), str(s["failed_after_connect"]), str(s["retried"]), str(s["slow_warned"]), str(s["session_p50_s"]),
                  str(s["session_p99_s"]), str(s["connect_p50_s"]),
                  str(s["connect_p99_s"]), str(s["turn_p50_s"]), ", ".join(map(str, s["fail_s"])) or "-",
                  str(s["load1_median"]))
    return t


# ---- the client processes ----------------------------------------------------------------

class _Watch(logging.Handler):
    """Counts the library's retry warnings and its slow-session warnings, and keeps the session time it logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.retries = 0
        self.slow_warnings = 0
        self.session_s: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "retry"):
            self.retries += 1
        elif hasattr(record, "waiting_s"):
            self.slow_warnings += 1
        elif hasattr(record, "session_s"):
            self.session_s = round(float(record.session_s), 3)


def _one(address: str, data_dir: str, soul: str, attempts: int) -> dict[str, Any]:
    import soul_runtime
    watch = _Watch()
    logger = logging.getLogger("soul_runtime.connect")
    logger.addHandler(watch)
    shown = logging.StreamHandler()  # the warnings as an application would show them
    shown.setLevel(logging.WARNING)
    shown.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(shown)
    logger.setLevel(logging.DEBUG)
    out: dict[str, Any] = {"stage": "connect"}
    t0 = time.monotonic()
    try:
        rt = soul_runtime.connect(address, data_dir=data_dir, connect_attempts=attempts)
        out["connect_s"] = round(time.monotonic() - t0, 3)
        t0, out["stage"] = time.monotonic(), "turn"
        rt.soul(soul).turn("The production database for Tendril is Postgres 15.", user="maya")
        out["turn_s"] = round(time.monotonic() - t0, 3)
        t0, out["stage"] = time.monotonic(), "close"
        rt.close()
        out["stage"] = "done"
    except Exception as e:  # fail_s: from the start of the stage that failed
        out.update(error=f"{type(e).__name__}: {e}", fail_s=round(time.monotonic() - t0, 2))
    out.update(retries=watch.retries, slow_warnings=watch.slow_warnings, session_s=watch.session_s)
    return out


def _busy(address: str, data_dir: str, inflight: int) -> dict[str, Any]:
    """Keep ``inflight`` turns in flight (threads over inflight/4 souls) until stdin closes."""
    import soul_runtime
    rt = soul_runtime.connect(address, data_dir=data_dir)
    stop = threading.Event()
    done = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        soul = rt.soul(f"busy{k % max(1, inflight // 4)}")
        n = 0
        while not stop.is_set():
            try:
                soul.turn(f"Worker {k} note {n}: the staging cluster runs Postgres {n % 17}.", user="ops")
            except Exception as e:
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:200])
            n += 1
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(inflight)]
    for th in threads:
        th.start()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    for th in threads:
        th.join(timeout=60)
    rt.close()
    return {"busy_turns": done[0], "busy_errors": len(errors), "busy_error_sample": errors[:3]}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "one":
        print(json.dumps(_one(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))), flush=True)
    elif mode == "busy":
        print(json.dumps(_busy(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
