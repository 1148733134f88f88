"""Paired small-batch timing of variants of the GDN fused replay launch (and of the
conventional step): where a batch-1 output step's time goes, and whether a kernel
change pays.

The variants are real kernels built from source:

* ``--leave-out STAGE ...``: the tree's ``kernels/gdn_step.py`` with one stage of the
  output path removed per variant (:data:`STAGES`).  Their outputs are wrong; they
  exist to be timed.
* ``--against REV``: the GDN step kernels of git revision REV of this checkout (its
  ``gdn_extra``, ``gdn_device``, ``gdn_flush`` and ``gdn_step``), both the replay
  launch (its flush included) and the conventional step.

fla's step, the tree's conventional step, the tree's replay window and every variant's
replay in paired rounds (``ColdL2Timer.interleaved``).  The graphs are rebuilt
``--reps`` times in a rotated order: at batch 1, where a state's buffers land moves a
step by about 0.3 us, so a single build can favour one graph over another.

    python benchmarks/ablate_gdn_step.py --model qwen3.5-4b --design replay-fp32 \\
        --leave-out normalisation ring-stores --out ablate.json
    python benchmarks/ablate_gdn_step.py --model qwen3.5-122b --design split-fp32-fp8 \\
        --against HEAD~1 --rounds 240 --out against.json

Exit 2 with one line on bad arguments, a revision git cannot show, a stage whose patch
no longer applies, a batch that the fused launch does not serve, or without a GPU. The
JSON is written whole or not at all.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: kernels/ must not shadow one

from precisionlab.kernels import gdn_decode, gdn_step  # noqa: E402
from precisionlab.presets import get_preset  # noqa: E402
from precisionlab.studies.bench_gdn import DESIGNS  # noqa: E402

MODULES = ("gdn_extra", "gdn_device", "gdn_flush", "gdn_step")
"""The kernel modules a revision's variant takes from that revision."""

_NORM = "q, k, qn, kn = _prep_qk_from(q_in, k_in, K, RING)\n        kqs"
_RING_KQ = ("        kk = tl.sum(Kr * k[None, :], axis=1)\n"
            "        kq = tl.sum(Kr * q[None, :], axis=1)\n")
_D_STORE = ("ring_store(ring_d + (pos * HV + h) * V + offs_v, ring_round(d, RING), offs_v < V, "
            "RING)")
_V_STORE = "ring_store(ring_v + (pos * HV + h) * V + offs_v, v, offs_v < V, RING)"
_HEAD = "        if vb == 0:\n"

STAGES: dict[str, list[tuple[str, str]]] = {
    "normalisation": [(_NORM, "q, k, qn, kn = q_in, k_in, 1.0, 1.0\n        kqs")],
    "ring-stores": [(_D_STORE, "pass"), (_V_STORE, "pass"), (_HEAD, "        if vb < 0:\n")],
    "d-store": [(_D_STORE, "pass")],
    "head-stores": [(_HEAD, "        if vb < 0:\n")],
    "ring-k-products": [(_RING_KQ, "        kk = tl.zeros([RP], dtype=tl.float32)\n"
                                   "        kq = tl.zeros([RP], dtype=tl.float32)\n")],
    "ring-d": [("DrT = tl.where(valid[:, None], ring_decode(Dr, RING), 0.0)",
                "DrT = tl.zeros([RP, BV], dtype=tl.float32)")],
    "state-row-sums": [("Sk0, Sq0 = tile_dots(codes, sc, s2v, k, q, K, BV, FMT)",
                        "Sk0 = tl.zeros([BV], dtype=tl.float32)\n"
                        "    Sq0 = tl.zeros([BV], dtype=tl.float32)")],
}
"""Stages of the fused output path a ``--leave-out`` variant removes: (text, its
replacement) pairs on ``gdn_step.py``, each text found exactly once.  ``normalisation``
uses the raw q and k; ``ring-stores`` drops the d and v appends and a head's first
tile's g, beta, k and k products; ``ring-k-products`` zeroes ``k_i . k`` and ``k_i . q``
(so the ring's k rows are not read); ``ring-d`` zeroes the ring's d rows (not read);
``state-row-sums`` zeroes ``S k`` and ``S q`` (so the state tile is not read)."""


class AblateError(Exception):
    """A usage error: one line, exit 2."""


def patched_source(stage: str, source: str) -> str:
    """``source`` (``gdn_step.py``) with ``stage`` left out."""
    for old, new in STAGES[stage]:
        if source.count(old) != 1:
            raise AblateError(f"stage {stage!r} no longer applies to gdn_step.py (its text "
                              f"occurs {source.count(old)} times, not once)")
        source = source.replace(old, new)
    return source


def revision_sources(rev: str) -> dict[str, str]:
    """The :data:`MODULES` sources of git revision ``rev``."""
    kdir = Path(gdn_step.__file__).resolve().parent
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=kdir, check=True,
                             capture_output=True, text=True).stdout.strip()
        rel = kdir.relative_to(Path(top).resolve()).as_posix()
        return {m: subprocess.run(["git", "show", f"{rev}:{rel}/{m}.py"], cwd=kdir,
                                  check=True, capture_output=True, text=True).stdout
                for m in MODULES}
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        raise AblateError(f"cannot read the kernels of revision {rev!r}: "
                          f"{detail.strip().splitlines()[-1] if detail.strip() else e}"
                          ) from None


def load_kernels(name: str, sources: dict[str, str], root: Path) -> ModuleType:
    """Import ``sources`` (module name -> text, among :data:`MODULES`) as package
    ``ablate_<name>`` under ``root``: imports between them stay inside the package, the
    other relative imports point at ``precisionlab.kernels``.  Returns its ``gdn_step``
    module (the tree's where ``sources`` has none)."""
    name = f"ablate_{name}"  # never an installed module's name
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for mod, src in sources.items():
        for own in sources:
            src = src.replace(f"from .{own} import", f"from {name}.{own} import")
        (pkg / f"{mod}.py").write_text(src.replace("from .", "from precisionlab.kernels."))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module(f"{name}.gdn_step")
    except Exception as e:  # a revision whose kernels import what the tree no longer has
        raise AblateError(f"the {name} kernels do not import: {type(e).__name__}: {e}"
                          ) from None


def variants(args: argparse.Namespace, root: Path) -> dict[str, tuple[object, object]]:
    """Name -> (replay kernel, conventional kernel or None) of each variant."""
    out = {}
    if args.against:
        mod = load_kernels("rev", revision_sources(args.against), root)
        out[f"{args.against} replay"] = (mod._replay_kernel, None)
        out[f"{args.against} conventional"] = (None, mod._conventional_kernel)
    tree = Path(gdn_step.__file__).read_text()
    for i, stage in enumerate(args.leave_out or ()):
        mod = load_kernels(f"leave_out_{i}", {"gdn_step": patched_source(stage, tree)}, root)
        out[f"without {stage}"] = (mod._replay_kernel, None)
    return out


def _graph(kind: str, s, clock, design: str, window: int, replay, conventional):
    from precisionlab.studies.bench_gdn import conventional_graph, fla_graph, replay_graph

    if kind == "fla":
        return fla_graph(s, clock), 1
    saved = gdn_decode._replay_kernel, gdn_decode._conventional_kernel
    gdn_decode._replay_kernel = replay or saved[0]
    gdn_decode._conventional_kernel = conventional or saved[1]
    try:
        if kind == "conventional":
            return conventional_graph(s, clock), 1
        return replay_graph(s, clock, *DESIGNS[design], window), window
    finally:
        gdn_decode._replay_kernel, gdn_decode._conventional_kernel = saved


def time_variants(args: argparse.Namespace, kernels: dict[str, tuple[object, object]]) -> dict:
    """Per graph: median us per step, speedup over fla (95% interval) and the median
    within-round difference from the tree's replay window (us), overall and per build."""
    from precisionlab.studies.bench_gdn import Clock, shape_of
    from precisionlab.timing import paired_speedups

    s, clock = shape_of(args.model, args.batch), Clock(torch.device("cuda"))
    plan = {"fla": ("fla", None, None), "conventional": ("conventional", None, None),
            "replay": ("replay", None, None)}
    for name, (rep, conv) in kernels.items():
        plan[name] = ("conventional", None, conv) if conv else ("replay", rep, None)
    names, per = list(plan), args.rounds // args.reps
    means: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.reps):
        order = names[r % len(names):] + names[:r % len(names)]  # placements vary
        built = {n: _graph(plan[n][0], s, clock, args.design, args.window, *plan[n][1:])
                 for n in order}
        graphs = {n: built[n] for n in names}
        clock.timer.interleaved(graphs, 1)  # every window back at its first position
        for n, m in clock.timer.interleaved(graphs, per).items():
            means[n] += m
        del built, graphs
        gc.collect()
        torch.cuda.empty_cache()
    st = paired_speedups(means, "fla")
    base = np.asarray(means["replay"])
    rows = {}
    for n in names:
        d = np.asarray(means[n]) - base
        rows[n] = {"us": st[n]["us"], "speedup_vs_fla": st[n]["speedup"],
                   "low": st[n]["low"], "high": st[n]["high"],
                   "minus_tree_replay_us": float(np.median(d)),
                   "per_build": [float(np.median(d[i * per:(i + 1) * per]))
                                 for i in range(args.reps)]}
        print(f"{n:>32}: {st[n]['us']:7.2f} us  {st[n]['speedup']:.3f}x fla "
              f"[{st[n]['low']:.3f}, {st[n]['high']:.3f}]  {np.median(d):+.3f} us against "
              "the tree's replay", flush=True)
    return {"rows": rows, "means": means}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.5-4b", help="a GDN preset")
    ap.add_argument("--design", choices=sorted(d for d in DESIGNS if d in (
        "replay-fp32", "split-fp32-fp8", "split-fp16sr-nvfp4")), default="replay-fp32")
    ap.add_argument("--leave-out", nargs="+", choices=sorted(STAGES), metavar="STAGE",
                    help=f"stages to leave out, one variant each: {', '.join(STAGES)}")
    ap.add_argument("--against", metavar="REV", help="a git revision whose kernels to time")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=240, help="paired rounds in all")
    ap.add_argument("--reps", type=int, default=4, help="graph builds the rounds spread over")
    ap.add_argument("--out", help="JSON file of the results")
    return ap.parse_args(argv)


def check(args: argparse.Namespace) -> None:
    try:
        p = get_preset(args.model)
    except KeyError as e:
        raise AblateError(str(e).strip("'\"")) from None
    if p.kind != "gdn":
        raise AblateError(f"{args.model} is a {p.kind} model; this script times GDN kernels")
    if not (args.leave_out or args.against):
        raise AblateError("give --leave-out STAGE ... and/or --against REV")
    if args.batch < 1 or args.window < 2 or args.reps < 1 or args.rounds < 2 * args.reps:
        raise AblateError("batch must be >= 1, window >= 2, reps >= 1 and rounds >= 2 x reps")
    if args.batch * p.heads >= 1024:
        raise AblateError(f"batch {args.batch} runs the staged launch (batch x v-heads >= "
                          "1024), which these variants do not change")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise AblateError(f"--out: no folder {Path(args.out).parent}")


def main(argv: list[str] | None = None) -> int:
    from precisionlab.atomic import write_json

    args = parse(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            check(args)
            kernels = variants(args, Path(tmp))
            if not torch.cuda.is_available():
                raise AblateError("needs a CUDA GPU")
        except AblateError as e:
            print(f"ablate_gdn_step.py: {e}", file=sys.stderr)
            return 2
        res = time_variants(args, kernels)
    if args.out:
        write_json(args.out, {"model": args.model, "design": args.design, "batch": args.batch,
                              "window": args.window, "rounds": args.rounds, "reps": args.reps,
                              "leave_out": args.leave_out, "against": args.against,
                              "device": torch.cuda.get_device_name(),
                              "torch": torch.__version__, **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
