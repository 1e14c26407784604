"""A data dir records the layout it is served with; a client or runtime with another one is refused."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from actors.settings import LAYOUT_FILE, RuntimeConfig, claim_data_dir, resolve, sizes_for
from soul_runtime.errors import ConfigError


def test_the_first_runtime_records_its_layout_and_others_must_match(tmp_path: Path) -> None:
    cfg = RuntimeConfig(data_dir=str(tmp_path), hosts=2, episodic_shards=2, semantic_shards=1, procedural_shards=1)
    rec = claim_data_dir(cfg)
    assert json.loads((tmp_path / LAYOUT_FILE).read_text()) == rec
    assert rec["episodic_shards"] == 2 and rec["namespace"] == "souls" and rec["embedder"]
    assert claim_data_dir(RuntimeConfig(data_dir=str(tmp_path))) == rec  # automatic counts take the recorded
    assert claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), host_capacity=3)) == rec  # not routing: fine
    for other in ({"episodic_shards": 3}, {"semantic_shards": 2}, {"hosts": 4}, {"namespace": "other"}):
        with pytest.raises(ConfigError, match=next(iter(other))):
            claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), **other))  # type: ignore[arg-type]
    (tmp_path / LAYOUT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        claim_data_dir(cfg)


def test_automatic_counts_follow_the_cluster_cpus() -> None:
    assert sizes_for(1) == {"hosts": 2, "episodic_shards": 2, "semantic_shards": 1, "procedural_shards": 1}
    assert sizes_for(2) == {"hosts": 2, "episodic_shards": 2, "semantic_shards": 1, "procedural_shards": 1}
    assert sizes_for(16) == {"hosts": 16, "episodic_shards": 16, "semantic_shards": 8, "procedural_shards": 4}
    assert sizes_for(10_000)["hosts"] == 64
    auto = RuntimeConfig(data_dir="/tmp/x")
    assert (auto.hosts, auto.episodic_shards) == (0, 0)
    got = resolve(auto, None, 8)
    assert (got.hosts, got.episodic_shards, got.semantic_shards, got.procedural_shards) == (8, 8, 4, 2)
    mixed = resolve(RuntimeConfig(data_dir="/tmp/x", hosts=3), None, 8)
    assert (mixed.hosts, mixed.episodic_shards) == (3, 8)  # what the user set stays
    recorded = {"hosts": 5, "episodic_shards": 4, "semantic_shards": 2, "procedural_shards": 1}
    kept = resolve(auto, recorded, 64)  # a data dir keeps the routing it was first served with
    assert (kept.hosts, kept.episodic_shards, kept.semantic_shards, kept.procedural_shards) == (5, 4, 2, 1)


def test_the_controller_resolves_automatic_counts_once_for_every_client(tmp_path: Path) -> None:
    """The controller (here its plain class, no Ray) decides the counts where the data dir is; a client asking
    for automatic counts gets them back; one asking for others is refused."""
    from actors.controller import RuntimeController

    claim_data_dir(RuntimeConfig(data_dir=str(tmp_path), hosts=3, episodic_shards=5, semantic_shards=2,
                                 procedural_shards=1))
    ctl = RuntimeController(RuntimeConfig(data_dir=str(tmp_path)).to_dict())
    assert (ctl.cfg.hosts, ctl.cfg.episodic_shards, ctl.cfg.semantic_shards) == (3, 5, 2)
    assert ctl.hosts == ["soul-host-0", "soul-host-1", "soul-host-2"]
    back = asyncio.run(ctl.check_layout(RuntimeConfig(data_dir=str(tmp_path)).to_dict()))
    assert RuntimeConfig.from_dict(back).episodic_shards == 5
    with pytest.raises(ConfigError, match="episodic_shards"):
        asyncio.run(ctl.check_layout(RuntimeConfig(data_dir=str(tmp_path), episodic_shards=2).to_dict()))
    fresh = tmp_path / "fresh"
    ctl2 = RuntimeController(RuntimeConfig(data_dir=str(fresh)).to_dict())  # nothing recorded: the CPUs
    assert ctl2.cfg.hosts == sizes_for(os.cpu_count() or 2)["hosts"]
    asyncio.run(ctl2.check_layout(RuntimeConfig(data_dir=str(fresh)).to_dict()))
    assert json.loads((fresh / LAYOUT_FILE).read_text())["hosts"] == ctl2.cfg.hosts
