"""The GPU kit's bookkeeping: what travels to the GPU machine in parts, and how it is put together there.

    python3 scripts/gpu_kit/kit.py pack --out gpu-kit/send OBJECT=PATH ... [--part-mib 56]   # here
    python3 scripts/gpu_kit/kit.py plan --send gpu-kit/send                                  # here
    python3 scripts/gpu_kit/kit.py dedupe BUNDLE                                             # here
    python3 scripts/gpu_kit/kit.py stash --send gpu-kit/send --work /tmp/kit                 # there
    python3 scripts/gpu_kit/kit.py join --work /tmp/kit                                      # there
    python3 scripts/gpu_kit/kit.py providers [--dry] --model X.onnx                           # there
    python3 scripts/gpu_kit/kit.py untar ARCHIVE DEST                                        # there

The machine receives at most 64 MiB a call (the working tree included) and keeps its files only while it
stays warm (~30 s after a call), so the objects (a wheel, a bundle, a GGUF, llama.cpp's source) are laid
end to end in one byte stream, cut into parts of --part-mib, one part per call. ``kit.json`` records each
part's and each object's sha256, and where each object lies in the stream: ``join`` extracts every
object whose bytes have all arrived, so a sequence cut short still yields the objects it carried in full.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

MANIFEST = "kit.json"
MiB = 2**20
# What travels with every call besides its part: the tree sparse-checked-out without weights (measured
# 4.05 MiB on 2026-12-06), the manifest, and room for files other sessions leave untracked.
TREE_MIB_GUESS = 4.5
CALL_LIMIT_MIB = 64


def sha256(path: Path, start: int = 0, size: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = size if size is not None else -1
        while left != 0:
            chunk = f.read(MiB if left < 0 else min(MiB, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk) if left > 0 else 0
    return h.hexdigest()


def pack(out: Path, objects: list[str], part_mib: float, made: dict) -> dict:
    """Lay the objects NAME=PATH end to end, in the order given, and cut the stream into parts of
    ``part_mib``: out/pNN/part.NN, each folder with a copy of kit.json (a call carries one folder)."""
    part_bytes = int(part_mib * MiB)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    entries, offset = [], 0
    for spec in objects:
        name, path = spec.split("=", 1)
        size = Path(path).stat().st_size
        entries.append({"name": name, "offset": offset, "size": size, "sha256": sha256(Path(path))})
        offset += size
    total, parts = offset, []
    n = (total + part_bytes - 1) // part_bytes
    streams = iter([(e["name"], Path(s.split("=", 1)[1])) for e, s in zip(entries, objects)])
    current = None  # (file object, bytes left in it)
    for i in range(n):
        folder = out / f"p{i:02d}"
        folder.mkdir()
        target, want = folder / f"part.{i:02d}", min(part_bytes, total - i * part_bytes)
        with open(target, "wb") as w:
            while want:
                if current is None or current[1] == 0:
                    if current is not None:
                        current[0].close()
                    _name, path = next(streams)
                    current = [open(path, "rb"), path.stat().st_size]
                chunk = current[0].read(min(want, current[1], 8 * MiB))
                w.write(chunk)
                want -= len(chunk)
                current[1] -= len(chunk)
        parts.append({"name": target.name, "folder": folder.name, "offset": i * part_bytes,
                      "size": target.stat().st_size, "sha256": sha256(target)})
    if current is not None:
        current[0].close()
    manifest = {"part_bytes": part_bytes, "total_bytes": total, "parts": parts, "objects": entries, "made": made}
    for p in parts:
        (out / p["folder"] / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def tree_mib(repo: Path, exclude: tuple[str, ...]) -> float:
    """What the working tree weighs as the device tool sends it: tracked files outside ``exclude`` (the
    sparse checkout's exclusions) and untracked files git does not ignore."""
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    size = 0
    for f in files:
        if f and not f.startswith(exclude) and (repo / f).is_file():
            size += (repo / f).stat().st_size
    return size / MiB


SPARSE_EXCLUDE = ("specrt/demo/bundle/", "demo/hf/", "benchmarks/heads/")


def plan(send: Path, repo: Path) -> str:
    """The exact sequence of device calls, as text."""
    m = json.loads((send / MANIFEST).read_text())
    tree = tree_mib(repo, SPARSE_EXCLUDE)
    parts, n = m["parts"], len(m["parts"])
    lines = [f"GPU kit: {m['total_bytes'] / MiB:.1f} MiB in {n} parts of at most {m['part_bytes'] / MiB:.0f} MiB; "
             f"the tree without weights weighs {tree:.2f} MiB now (sparse checkout below)."]
    for o in m["objects"]:
        first = next(p for p in parts if p["offset"] + p["size"] > o["offset"])
        last = next(p for p in parts if p["offset"] + p["size"] >= o["offset"] + o["size"])
        lines.append(f"  {o['name']:40s} {o['size'] / MiB:7.1f} MiB  parts {first['folder']}..{last['folder']}")
    worst = max(p["size"] for p in parts) / MiB + tree + 0.1
    if worst > CALL_LIMIT_MIB:
        lines.append(f"!! a call would carry {worst:.1f} MiB > {CALL_LIMIT_MIB} MiB: pack with a smaller --part-mib")
    lines += [
        "",
        "Before the first call, from the repository root here (leaves the weights out of the tree that travels;",
        "`git sparse-checkout disable` restores them after the last call):",
        "  git sparse-checkout set --no-cone '/*' " + " ".join(f"'!/{e}'" for e in SPARSE_EXCLUDE),
        "",
        "Then these device `run` calls, each IMMEDIATELY after the previous one returns (the machine keeps /tmp/kit",
        "only while warm, ~30 s after a call; if one is given back, start again at call 1). Leave `kind` out.",
        "Device time runs from the first call until the machine goes back, idle gaps included: no analysis between",
        "calls; read the outputs after the measuring call (or after a failed one).",
    ]
    for i, p in enumerate(parts):
        mib = p["size"] / MiB + tree + 0.1
        stages = "stash join llama-bg install check" if i == n - 1 else "stash join llama-bg" if i == 0 else "stash"
        lines.append(f"  call {i + 1:2d}/{n + 1}: carry [\"gpu-kit/send/{p['folder']}\"] (~{mib:.0f} MiB), timeout_s "
                     f"{240 if i == n - 1 else 120}, command: bash scripts/gpu_kit/run.sh {stages}")
    lines += [
        f"  call {n + 1:2d}/{n + 1}: carry [] (~{tree:.0f} MiB), timeout_s 600, "
        "command: bash scripts/gpu_kit/run.sh measure",
        "     (expected 4-5 min; MEASURE_S=420 caps it: steps that no longer fit are skipped, in issue 63's order)",
        "  rerun, only while the machine is still warm: the same `measure` call again (a cold machine has lost",
        "     /tmp/kit: the whole sequence would be needed again).",
        "",
        f"Call {n} fails loudly (exit 2) if onnxruntime-gpu does not run a real session on CUDA: stop there, read its",
        "output (ldd's 'not found' lines name a missing CUDA library), and give the machine back.",
        "Call 1 starts llama.cpp's CUDA build in the background (setsid, nice 19, -j nproc-3) while the other",
        "parts travel; `measure` waits for it (LLAMA_WAIT_S, default 300 s) only before its llama.cpp step, which",
        "comes after specrt's.",
        "Results come back in $OUT: kit.json (every step, issue 63's target ratios), bench-*.json, kit.log.",
        f"Budget: machine start (1-2 min) + {n} part calls + one measuring call (4-5 min) + one rerun of it.",
    ]
    return "\n".join(lines)


def stash(send: Path, work: Path) -> int:
    """Copy the parts this call carried into work/parts (sha256 checked), and the manifest beside them."""
    (work / "parts").mkdir(parents=True, exist_ok=True)
    folders = sorted(send.glob("p[0-9][0-9]")) if send.is_dir() else []
    for folder in folders:
        m = json.loads((folder / MANIFEST).read_text())
        shutil.copyfile(folder / MANIFEST, work / MANIFEST)
        for p in m["parts"]:
            src, dst = folder / p["name"], work / "parts" / p["name"]
            if src.is_file() and not dst.is_file():
                if sha256(src) != p["sha256"]:
                    print(f"stash: {src} is corrupt (sha256 differs)", file=sys.stderr)
                    return 3
                shutil.copyfile(src, dst)
                print(f"stash: {p['name']} ({p['size'] / MiB:.1f} MiB) kept in {work / 'parts'}")
    if not (work / MANIFEST).is_file():
        print(f"stash: no part here ({send}/pNN/kit.json) and none stashed before in {work}", file=sys.stderr)
        return 3
    m = json.loads((work / MANIFEST).read_text())
    have = [p["name"] for p in m["parts"] if (work / "parts" / p["name"]).is_file()]
    print(f"stash: {len(have)}/{len(m['parts'])} parts on this machine; missing: "
          + (", ".join(p["folder"] for p in m["parts"] if p["name"] not in have) or "none"))
    return 0


def join(work: Path) -> int:
    """Extract each object whose bytes have all arrived into work/obj/NAME, checked against its sha256."""
    m = json.loads((work / MANIFEST).read_text())
    (work / "obj").mkdir(exist_ok=True)
    have = {p["name"]: p for p in m["parts"] if (work / "parts" / p["name"]).is_file()}
    missing = []
    for o in m["objects"]:
        dst = work / "obj" / o["name"]
        if dst.is_file() and dst.stat().st_size == o["size"]:
            continue  # extracted and checked by an earlier call
        end = o["offset"] + o["size"]
        span = [p for p in m["parts"] if p["offset"] < end and p["offset"] + p["size"] > o["offset"]]
        if any(p["name"] not in have for p in span):
            missing.append(o["name"])
            continue
        tmp = dst.with_suffix(dst.suffix + ".tmp")
        with open(tmp, "wb") as w:
            for p in span:
                start = max(o["offset"], p["offset"]) - p["offset"]
                end = min(o["offset"] + o["size"], p["offset"] + p["size"]) - p["offset"]
                with open(work / "parts" / p["name"], "rb") as f:
                    f.seek(start)
                    left = end - start
                    while left:
                        chunk = f.read(min(left, 8 * MiB))
                        w.write(chunk)
                        left -= len(chunk)
        if sha256(tmp) != o["sha256"]:
            tmp.unlink()
            print(f"join: {o['name']} does not match its sha256", file=sys.stderr)
            return 3
        tmp.rename(dst)
        print(f"join: {o['name']} ({o['size'] / MiB:.1f} MiB) ok")
    if missing:
        print("join: not yet complete: " + ", ".join(missing))
    return 0


def providers(dry: bool, probe_model: Path | None) -> int:
    """What this onnxruntime is and whether a real session runs on CUDA (get_available_providers() lists
    CUDA even where a session then falls back to the CPU: platform-facts.md)."""
    import onnxruntime as ort

    avail = ort.get_available_providers()
    info = {"onnxruntime": ort.__version__, "file": ort.__file__, "device": ort.get_device(), "available": avail}
    print("providers: " + json.dumps(info))
    if dry:  # the same session, on whatever this onnxruntime offers; nothing required of it
        used = ort.InferenceSession(str(probe_model), providers=[p for p in ("CUDAExecutionProvider",
                                                                            "CPUExecutionProvider") if p in avail])
        print(f"providers: DRY RUN: a session on {probe_model.name} runs on {used.get_providers()}; on the GPU this "
              "stage requires 'CUDAExecutionProvider' in get_available_providers() and as get_providers()[0]")
        return 0
    if "CUDAExecutionProvider" not in avail:
        print("providers: FAIL: this onnxruntime has no CUDAExecutionProvider (the GPU wheel is not first on "
              "PYTHONPATH?)", file=sys.stderr)
        return 2
    ort.set_default_logger_severity(1)  # say why a CUDA provider fails to load (a missing libcu*.so)
    session = ort.InferenceSession(str(probe_model), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    used = session.get_providers()
    print(f"providers: a session on {probe_model.name} runs on {used}")
    if used[0] != "CUDAExecutionProvider":
        print("providers: FAIL: the session fell back to the CPU (see the log lines above: usually a CUDA library "
              "not on LD_LIBRARY_PATH)", file=sys.stderr)
        return 2
    return 0


def dedupe(bundle: Path, graph: str = "eagle.onnx", into: str = "target.onnx") -> int:
    """Point ``graph``'s inline weights that ``into``'s external data already holds byte for byte at those bytes.

    An EAGLE-3 head without an embedding table of its own carries a copy of the target's (SmolLM2-135M fp16:
    54 MiB of eagle.onnx's 82 MiB, one whole call of the device tool). ONNX external data may name any file in
    the graph's folder, at an offset, so the head reads the target's table from target.onnx.data instead; the
    bytes a session sees are the same."""
    import onnx

    head = onnx.load(str(bundle / graph), load_external_data=False)
    target = onnx.load(str(bundle / into), load_external_data=False)
    found = {}
    for t in target.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            d = {kv.key: kv.value for kv in t.external_data}
            found.setdefault((tuple(t.dims), t.data_type), []).append(d)
    saved = 0
    for t in head.graph.initializer:
        if len(t.raw_data) < MiB:
            continue
        for d in found.get((tuple(t.dims), t.data_type), []):
            with open(bundle / d["location"], "rb") as f:
                f.seek(int(d.get("offset", 0)))
                if f.read(int(d["length"])) != t.raw_data:
                    continue
            saved += len(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for k in ("location", "offset", "length"):
                entry = t.external_data.add()
                entry.key, entry.value = k, d.get(k, "0")
            print(f"dedupe: {graph}:{t.name} {list(t.dims)} read from {d['location']} at {d.get('offset', 0)}")
            break
    if saved:
        onnx.save(head, str(bundle / graph))
    print(f"dedupe: {graph} {saved / MiB:.1f} MiB smaller ({(bundle / graph).stat().st_size / MiB:.1f} MiB)")
    return 0


def untar(archive: Path, dest: Path) -> int:
    """Python's tarfile, not tar: the image may lack the xz program, never the lzma module."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as t:
        t.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--part-mib", type=float, default=56)
    p.add_argument("--made", type=Path, help="a JSON file of provenance to record in kit.json")
    p.add_argument("objects", nargs="+", metavar="NAME=PATH")
    p = sub.add_parser("plan")
    p.add_argument("--send", type=Path, required=True)
    p.add_argument("--repo", type=Path, default=Path("."))
    p = sub.add_parser("stash")
    p.add_argument("--send", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p = sub.add_parser("join")
    p.add_argument("--work", type=Path, required=True)
    p = sub.add_parser("providers")
    p.add_argument("--dry", action="store_true")
    p.add_argument("--model", type=Path, help="an ONNX file to open a real session on")
    p = sub.add_parser("dedupe")
    p.add_argument("bundle", type=Path)
    p = sub.add_parser("untar")
    p.add_argument("archive", type=Path)
    p.add_argument("dest", type=Path)
    a = ap.parse_args()
    if a.cmd == "dedupe":
        return dedupe(a.bundle)
    if a.cmd == "untar":
        return untar(a.archive, a.dest)
    if a.cmd == "pack":
        made = json.loads(a.made.read_text()) if a.made else {}
        m = pack(a.out, a.objects, a.part_mib, made)
        print(f"pack: {len(m['parts'])} parts, {m['total_bytes'] / MiB:.1f} MiB, in {a.out}")
        return 0
    if a.cmd == "plan":
        print(plan(a.send, a.repo))
        return 0
    if a.cmd == "stash":
        return stash(a.send, a.work)
    if a.cmd == "join":
        return join(a.work)
    return providers(a.dry, a.model)


if __name__ == "__main__":
    sys.exit(main())
