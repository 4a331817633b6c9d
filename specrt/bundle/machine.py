"""The machine a bundle's measured choices were made on (``specrt quantize --kernel auto``'s timing), so that
running the bundle elsewhere can say the choice may not hold there. Torch-free, numpy-free."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name and, on x86, its family and model ("AMD EPYC (family 25, model 17)": a VM's name
    alone may not tell a Zen 3 from a Zen 4), or what Python knows of it."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or fields.get("Model")
    if not name:
        return platform.processor() or platform.machine() or "unknown"
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def kernel_choice_note(quantization: dict | None, here: str | None = None) -> str | None:
    """A note when a target's int8 format was chosen by timing on another CPU than this one; else None."""
    choice = (quantization or {}).get("kernel_choice")
    if not choice or not choice.get("cpu"):
        return None
    here = here if here is not None else cpu_name()
    if choice["cpu"] == here:
        return None
    return (f"the target's int8 format ({choice['chosen']}) was chosen by timing on {choice['cpu']}; this is "
            f"{here}: `specrt quantize --kernel auto` here may choose the other")
