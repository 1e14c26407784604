"""What every soul-runtime actor answers about itself (for tests, operators and fault injection)."""

from __future__ import annotations

import os
from typing import Any

from . import raycalls
from .metrics import Metrics


class ActorInfo:
    metrics: Metrics

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": raycalls.node_id()}

    def metrics_snapshot(self) -> dict[str, int]:
        """What this actor counted (also exported through ray.util.metrics)."""
        return dict(self.metrics.local)
