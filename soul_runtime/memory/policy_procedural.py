"""Procedural policy (pure): when a workflow becomes a procedure, and version rollout.

* The ``procedure_successes``-th successful run of a task class with the same step
  pattern creates v1 (active); so does an explicit "save this as a procedure".
* A success with other steps than the active version creates a candidate version
  beside it; the candidate becomes active (the old one retired) after
  ``rollout_clean_runs`` clean runs, and is rolled back (retired) on a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from soul_runtime.config import MemoryConfig
from soul_runtime.records import Op, Procedure, TaskReport
from soul_runtime.text import normalise


def step_signature(steps: tuple[str, ...]) -> str:
    return " | ".join(normalise(s).strip(" .") for s in steps)


@dataclass(frozen=True)
class TaskRun:
    task_class: str
    signature: str
    steps: tuple[str, ...]
    outcome: str
    at: float
    sources: tuple[str, ...]


@dataclass(frozen=True)
class ProcedureChange:
    op: Op
    reason: str
    procedure: Procedure


def _find(procs: list[Procedure], status: str) -> Procedure | None:
    return next((p for p in sorted(procs, key=lambda p: -p.version) if p.status == status), None)


def decide_procedure(report: TaskReport, runs: list[TaskRun], procs: list[Procedure], *, sources: tuple[str, ...],
                     now: float, cfg: MemoryConfig) -> list[ProcedureChange]:
    """What a reported task outcome (or save request) does to the stored procedures.

    ``runs`` are the earlier runs of this task class (not including this one);
    ``procs`` all stored versions of the task class.
    """
    steps = tuple(report.steps)
    sig = step_signature(steps)
    active, candidate = _find(procs, "active"), _find(procs, "candidate")
    next_version = max((p.version for p in procs), default=0) + 1
    changes: list[ProcedureChange] = []

    def new(status: str, srcs: tuple[str, ...], why: str, clean: int | None = None) -> None:
        if clean is None:
            clean = 1 if report.outcome == "success" else 0
        proc = Procedure(task_class=report.task_class, version=next_version, steps=steps, status=status,
                         sources=srcs, created_at=now, clean_runs=clean)
        changes.append(ProcedureChange(Op.ADD, why, proc))

    if not steps:
        return changes
    if report.save_requested and report.outcome != "failure":
        if active is None:
            new("active", sources, "explicit request: save as a procedure")
        elif step_signature(active.steps) != sig and (candidate is None or step_signature(candidate.steps) != sig):
            new("candidate", sources, "explicit request: saved beside the active version until it runs clean")
        return changes

    if report.outcome == "failure":
        if candidate is not None and step_signature(candidate.steps) == sig:
            changes.append(ProcedureChange(Op.DELETE, "candidate failed: rolled back to the active version",
                                           replace(candidate, status="retired", failures=candidate.failures + 1)))
        elif active is not None and step_signature(active.steps) == sig:
            changes.append(ProcedureChange(Op.UPDATE, "active version failed once",
                                           replace(active, failures=active.failures + 1)))
        return changes
    if report.outcome != "success":
        return changes

    if active is not None and step_signature(active.steps) == sig:
        changes.append(ProcedureChange(Op.UPDATE, "active version ran clean",
                                       replace(active, clean_runs=active.clean_runs + 1)))
        return changes
    if candidate is not None and step_signature(candidate.steps) == sig:
        runs_now = candidate.clean_runs + 1
        if runs_now >= cfg.rollout_clean_runs:
            changes.append(ProcedureChange(Op.UPDATE, f"candidate ran clean {runs_now}x: now active",
                                           replace(candidate, status="active", clean_runs=runs_now)))
            if active is not None:
                changes.append(ProcedureChange(Op.UPDATE, f"replaced by v{candidate.version}",
                                               replace(active, status="retired")))
        else:
            changes.append(ProcedureChange(
                Op.UPDATE, f"candidate ran clean {runs_now}/{cfg.rollout_clean_runs}",
                replace(candidate, clean_runs=runs_now, sources=candidate.sources + sources)))
        return changes
    if active is not None:
        if candidate is None:
            new("candidate", sources, "changed steps succeeded: kept beside the active version")
        return changes
    same = [r for r in runs if r.signature == sig and r.outcome == "success"]
    if len(same) + 1 >= cfg.procedure_successes:
        srcs: tuple[str, ...] = ()
        for r in same:
            srcs += tuple(s for s in r.sources if s not in srcs)
        srcs += tuple(s for s in sources if s not in srcs)
        new("active", srcs, f"{len(same) + 1} successful runs with the same steps", clean=len(same) + 1)
    return changes
