"""The machine probes commands run beside a measurement, each falling back to a stated reason instead of an
error: a probe that cannot run here (no GPU, no readable energy counter) says why and the rest goes on."""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from . import bandwidth as bw
from .energy import EnergyMeter, find_sources


def bandwidth_probes(array_bytes: int | None = None) -> list[dict]:
    """Host and GPU bandwidth (``specrt doctor --bandwidth``), each as a dict; a probe that cannot run
    gives ``{"device": ..., "skipped": why}`` instead."""
    out = [asdict(bw.host_bandwidth(array_bytes))]
    try:
        out.append(asdict(bw.cuda_bandwidth(array_bytes)))
    except bw.ProbeUnavailable as e:
        out.append({"device": "GPU", "skipped": str(e)})
    return out


def roofline_bandwidth(provider: str, notes: list[str],
                       on_status: Callable[[str], None] | None = None) -> bw.Bandwidth | None:
    """The bandwidth probe that fits the backend's ``provider`` (``specrt bench --roofline``), or None with
    a note in ``notes`` saying why it could not run."""
    if on_status:
        on_status("measuring memory bandwidth…")
    try:
        return bw.measure(provider)
    except bw.ProbeUnavailable as e:
        notes.append(f"roofline: {e}; give --bandwidth GBPS instead")
        return None


def energy_meter(notes: list[str]) -> EnergyMeter | None:
    """An EnergyMeter over every readable source (``specrt bench --energy``), or None; why the others are
    missing goes into ``notes``."""
    found = find_sources()
    notes += [f"energy: {n}" for n in found.notes]
    if not found.sources:
        notes.append("energy: no readable energy source on this machine, so no joules per token")
        return None
    return EnergyMeter(found.sources)
