"""Paired timing against the peer: the round orders, the per-round means, the
speedup statistics and the argument checks (CPU: the timer's replays are stubbed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precisionlab.studies.paired import KERNELS, PairedError, check_paired
from precisionlab.timing import ColdL2Timer, paired_speedups, round_orders


def test_round_orders_rotate_every_name_through_every_place() -> None:
    names = ["peer", "a", "b"]
    orders = round_orders(names, 6)
    assert all(sorted(o) == sorted(names) for o in orders)
    for place in range(3):
        firsts = [o[place] for o in orders]
        assert all(firsts.count(n) == 2 for n in names)


class _StubTimer(ColdL2Timer):
    """Queued replays come back as the graph's next times (no GPU); records the
    queueing and the synchronisations."""

    def __init__(self, clock: dict[str, list[float]]):
        self.calls: list[tuple[str, int] | str] = []
        self.clock = clock
        self.flush = self

    def fill_(self, value: float) -> None:
        self.calls.append("flush")

    def _enqueue(self, step, n):
        self.calls.append((step, n))
        return [self.clock[step].pop(0) for _ in range(n)]

    def _sync(self) -> None:
        self.calls.append("sync")

    @staticmethod
    def _elapsed(pending):
        return pending


def test_interleaved_queues_a_round_then_waits_once_and_averages_each_period() -> None:
    t = _StubTimer({"peer": [8.0, 9.0], "win": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    means = t.interleaved({"peer": ("peer", 1), "win": ("win", 3)}, 2)
    assert t.calls == ["flush", ("peer", 1), ("win", 3), "sync",
                       "flush", ("win", 3), ("peer", 1), "sync"]
    assert means == {"peer": [8.0, 9.0], "win": [2.0, 5.0]}


def test_a_common_drift_cancels_in_the_paired_speedup() -> None:
    rng = np.random.default_rng(1)
    drift = 8.0 * (1.0 + 0.1 * rng.standard_normal(40))  # clocks moving round to round
    st = paired_speedups({"peer": drift, "ours": drift / 1.05, "slow": drift * 1.1}, "peer")
    assert st["ours"]["speedup"] == pytest.approx(1.05)
    assert st["ours"]["low"] == pytest.approx(1.05) and st["ours"]["high"] == pytest.approx(1.05)
    assert st["ours"]["faster"] == 1.0 and st["slow"]["faster"] == 0.0
    assert st["slow"]["speedup"] == pytest.approx(1 / 1.1)
    assert st["peer"]["speedup"] == 1.0
    assert st["ours"]["us"] == pytest.approx(np.median(drift / 1.05))


def test_noisy_rounds_give_an_interval_around_the_median_ratio() -> None:
    rng = np.random.default_rng(2)
    peer = 8.0 + 0.3 * rng.standard_normal(60)
    ours = 8.0 + 0.3 * rng.standard_normal(60)
    st = paired_speedups({"peer": peer, "ours": ours}, "peer")["ours"]
    assert st["low"] < st["speedup"] < st["high"]
    assert st["low"] < 1.0 < st["high"]  # the same kernel speed: the interval holds 1
    assert 0.0 < st["faster"] < 1.0


@pytest.mark.parametrize("means,peer,msg", [
    ({"ours": [1.0, 2.0]}, "peer", "no times of the peer"),
    ({"peer": [1.0, 2.0], "ours": [1.0]}, "peer", "same number of rounds"),
    ({"peer": [1.0], "ours": [1.0]}, "peer", "at least 2 rounds"),
])
def test_paired_speedups_reject_bad_rounds(means, peer, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        paired_speedups(means, peer)


def test_check_paired_defaults_and_errors() -> None:
    assert check_paired("qwen3.5-4b", None, 1, 16, 2) == ("gdn", list(KERNELS["gdn"]))
    assert check_paired("nemotron-3-nano-4b", ["replay-fp32", "replay-fp32"], 1, 16, 2) == (
        "mamba2", ["replay-fp32"])
    with pytest.raises(PairedError, match="unknown model"):
        check_paired("no-such-model", None, 1, 16, 2)
    with pytest.raises(PairedError, match="verify-T4"):
        check_paired("nemotron-3-nano-4b", ["verify-T4"], 1, 16, 2)
    with pytest.raises(PairedError, match="rounds >= 2"):
        check_paired("nemotron-3-nano-4b", None, 1, 16, 1)
    assert check_paired("qwen3.5-4b", None, 256, 16, 2, 8)[0] == "gdn"
    assert check_paired("nemotron-3-nano-4b", None, 256, 16, 2, 8)[0] == "mamba2"
    for model in ("qwen3.5-4b", "nemotron-3-nano-4b"):
        for bad in (0, True, 2.0):
            with pytest.raises(PairedError, match="layers must be an integer >= 1"):
                check_paired(model, None, 1, 16, 2, bad)


def test_gdn_graphs_pass_the_layers_to_every_graph(monkeypatch) -> None:
    """``layers``: the peer's graph and each of ours run that many layers."""
    from precisionlab.studies import bench_gdn, paired

    seen = {}
    monkeypatch.setattr(bench_gdn, "fla_available", lambda: True)
    monkeypatch.setattr(bench_gdn, "fla_graph",
                        lambda s, clock, layers=1: seen.setdefault("fla", layers))
    monkeypatch.setattr(bench_gdn, "conventional_graph",
                        lambda s, clock, cfg=None, layers=1: seen.setdefault("conv", layers))
    monkeypatch.setattr(bench_gdn, "replay_graph",
                        lambda s, clock, ck, rd, L, cfg=None: seen.setdefault(ck + str(rd),
                                                                              cfg["layers"]))
    graphs = paired._gdn_graphs("qwen3.5-4b", 2, 4, ["conventional", "split-fp32-fp8"],
                                torch.device("cpu"), layers=3)
    assert seen == {"fla": 3, "conv": 3, "fp32fp8-e4m3": 3}
    assert [g[1] for g in graphs.values()] == [1, 1, 4]  # periods: one step, a window


def test_mamba2_runner_steps_every_layer_in_turn(monkeypatch) -> None:
    """``_Runner(layers=N)``: the captured step of a replay design, the conventional
    step and the peer runs N layers, each with its own cache or state, in the same
    order every time; the times are per layer."""
    from precisionlab import timing
    from precisionlab.kernels import mamba2_step as m2
    from precisionlab.studies.bench_mamba2 import _Problem, _Runner

    calls = []
    monkeypatch.setattr(timing, "capture", lambda fn, warmup=1: (fn(), fn)[1])
    monkeypatch.setattr(m2, "mamba2_step", lambda c, *a, **kw: calls.append(id(c)))
    monkeypatch.setattr(m2, "mamba2_conventional_step", lambda s, *a, **kw: calls.append(id(s)))

    class Timer:
        def median(self, g, n):
            g()
            return 6.0

        def cycle(self, g, period, rounds):
            return [6.0] * period

        def replays(self, g, n):
            g()

    prob = _Problem("nemotron-3-nano-4b", 2, torch.device("cpu"))
    runner = _Runner(Timer(), 1, print, layers=3)
    for timed in (lambda: runner.replay(prob, "fp32", "fp8-e4m3", 4, None),
                  lambda: runner.conventional(prob, (16, 1)),
                  lambda: runner.peer(prob, lambda state, *a, **kw: calls.append(id(state)))):
        calls.clear()
        assert timed() in ([2.0] * 4, [2.0])
        assert len(set(calls)) == 3 and calls == calls[:3] * (len(calls) // 3)
    with pytest.raises(ValueError, match="one layer at a time"):
        runner.verify(prob, 4, 2, (16, 1))
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="layers must be an integer >= 1"):
            _Runner(Timer(), 1, print, layers=bad)


def test_the_script_without_a_gpu_exits_2_and_writes_nothing(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("times kernels where there is a GPU")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "paired_bench.py"
    r = subprocess.run([sys.executable, str(script), "--out", "p.json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []
