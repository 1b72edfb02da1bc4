"""A fake installed distribution declaring one entry point: what ``pip install`` of a plug-in
package leaves on the path (shared by the plug-in seam tests of LM backends and agents)."""

from __future__ import annotations

from pathlib import Path


def install_entry_point(site: Path, group: str, name: str, target: str, dist: str) -> None:
    """Write ``<dist>-0.1.dist-info`` under ``site`` declaring ``name = target`` in ``group``."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
