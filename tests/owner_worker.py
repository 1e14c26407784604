"""A process that owns a soul in process (no Ray), for the fencing tests in ``test_owner.py``.

``python -m tests.owner_worker DIR NAME TURNS MODE``; one JSON line per event on stdout:
``{"ack": request_id, "seq": n}``, ``{"refused": request_id}``, ``{"pause": "reply"|"write"}``.

MODE ``race``: run TURNS turns; when superseded (StaleOwner), reopen the soul (a new activation: it
claims the soul back) and retry the same request id. MODE ``pause-reply`` / ``pause-write``: announce
``pause`` during the model call / between the write intent and the layer writes of the last turn, sleep
(the test SIGSTOPs the process there), then go on; a refusal ends the process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from soul_runtime.errors import StaleOwner
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


class PausingModel(OfflineModel):
    pause = False

    def reply(self, request: Any) -> Any:
        if self.pause:
            say(pause="reply")
            time.sleep(1.0)
        return super().reply(request)


class PausingMemory(SoulMemory):
    pause = False

    def write_many(self, reqs: Any) -> Any:
        if self.pause:
            say(pause="write")
            time.sleep(1.0)
        return super().write_many(reqs)


def text(name: str, i: int) -> str:
    return f"The backup bucket for {name} is {name}-bucket-{i}."


def main(directory: str, name: str, turns: int, mode: str) -> None:
    d = Path(directory)
    model = PausingModel()

    def activate() -> tuple[Soul, SoulMemory]:
        while True:
            mem = PausingMemory(d, embedder=HashEmbedder())
            try:
                return Soul("contested", d, memory=mem, model=model), mem
            except StaleOwner:  # superseded while recovering: claim again
                say(refused="activation")
                mem.close()

    soul, mem = activate()
    for i in range(turns):
        rid = f"{name}-{i}"
        last = i == turns - 1
        model.pause = last and mode == "pause-reply"
        mem.pause = last and mode == "pause-write"
        while True:
            try:
                r = soul.turn(text(name, i), user=name, at=1_780_000_000 + i, request_id=rid)
                say(ack=rid, seq=r.seq)
                break
            except StaleOwner:
                say(refused=rid)
                soul.close()
                mem.close()
                if mode != "race":
                    return
                soul, mem = activate()
    soul.close()
    mem.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
