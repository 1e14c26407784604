"""Ordering under load: 200 concurrent submitters (threads here and in other processes) on one soul,
with retried requests. Turns must be strictly ordered, none lost, none applied twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
THREADS_HERE = 140
PROCESSES = 2
THREADS_PER_PROCESS = 30

CLIENT = textwrap.dedent("""
    import json, sys, threading
    import soul_runtime
    address, data_dir, namespace, soul_id, tag, n = sys.argv[1:7]
    rt = soul_runtime.connect(address, data_dir=data_dir, namespace=namespace)
    s = rt.soul(soul_id)
    done, errors = [], []
    def go(i):
        rid = f"{tag}-{i}"
        try:
            a = s.turn(f"{tag} submitter {i} reports build {i} is green.", user="ci", request_id=rid)
            b = s.turn(f"{tag} submitter {i} reports build {i} is green.", user="ci", request_id=rid)  # a retry
            assert a.seq == b.seq and a.turn_id == b.turn_id
            done.append([rid, a.seq])
        except Exception as e:
            errors.append(repr(e))
    ts = [threading.Thread(target=go, args=(i,)) for i in range(int(n))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print(json.dumps({"done": done, "errors": errors}))
""")


def test_two_hundred_submitters_one_soul(runtime, soul_id) -> None:
    import ray

    from actors import raycalls
    gcs = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, gcs, runtime.cfg.data_dir, runtime.cfg.namespace,
                               soul_id, f"p{k}", str(THREADS_PER_PROCESS)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, cwd=ROOT, text=True) for k in range(PROCESSES)]
    s = runtime.soul(soul_id)
    done: list[tuple[str, int]] = []
    errors: list[str] = []

    def go(i: int) -> None:
        rid = f"t-{i}"
        try:
            r = s.turn(f"thread submitter {i} reports build {i} is green.", user="ci", request_id=rid)
            if i % 4 == 0:  # retried requests return the same turn
                again = s.turn(f"thread submitter {i} reports build {i} is green.", user="ci", request_id=rid)
                assert again.seq == r.seq
            done.append((rid, r.seq))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=go, args=(i,)) for i in range(THREADS_HERE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
        res = json.loads(out.strip().splitlines()[-1])
        errors += res["errors"]
        done += [tuple(x) for x in res["done"]]
    assert not errors, errors[:3]
    total = THREADS_HERE + PROCESSES * THREADS_PER_PROCESS
    assert len(done) == total == 200
    seqs = sorted(seq for _, seq in done)
    assert seqs == list(range(1, total + 1))  # dense: nothing lost, nothing twice
    traces = s.traces(last=total + 10)
    assert [t.seq for t in traces] == list(range(1, total + 1))
    assert Counter(t.request_id for t in traces) == Counter(rid for rid, _ in done)
    by_rid = {rid: seq for rid, seq in done}
    assert all(by_rid[t.request_id] == t.seq for t in traces)
    assert raycalls.get(raycalls.call(runtime.controller, "ping")) == "ok"
