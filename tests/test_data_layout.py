"""A data dir records the layout it is served with; a client or runtime with another one is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.settings import LAYOUT_FILE, RuntimeConfig, claim_data_dir
from soul_runtime.errors import ConfigError


def test_the_first_runtime_records_its_layout_and_others_must_match(tmp_path: Path) -> None:
    cfg = RuntimeConfig(data_dir=str(tmp_path))
    rec = claim_data_dir(cfg)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == rec
    assert rec["episodic_shards"] == 2 and rec["namespace"] == "souls" and rec["embedder"]
    assert claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), host_capacity=3)) == rec  # not routing: fine
    for other in ({"episodic_shards": 3}, {"semantic_shards": 2}, {"hosts": 4}, {"namespace": "other"}):
        with pytest.raises(ConfigError, match=next(iter(other))):
            claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), **other))  # type: ignore[arg-type]
    (tmp_path / LAYOUT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        claim_data_dir(cfg)
