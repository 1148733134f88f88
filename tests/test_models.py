"""Model-level studies: tiny hybrid models of every supported architecture, saved
with ``save_pretrained`` and loaded back through the checkpoint path a user's model
takes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from precisionlab import engine  # noqa: E402
from precisionlab.designs import TorchDesignRunner, make_design  # noqa: E402
from precisionlab.kinds import kind_for, ring_dtype_of  # noqa: E402
from precisionlab.models import (  # noqa: E402
    CaptureError,
    DesignDecode,
    ModelError,
    capture_trace,
    load_checkpoint,
    open_model,
    prompt_ids,
    synthetic_model,
)
from precisionlab.models.runtime import CACHE_KWARGS, rows  # noqa: E402
from precisionlab.models.synthetic import (  # noqa: E402
    ARCHITECTURES,
    build_config,
    build_model,
    init_weights_,
    layer_plan,
)
from precisionlab.presets import PRESETS, Preset  # noqa: E402
from precisionlab.studies.drift import StudyError  # noqa: E402
from precisionlab.traces import SavedTrace, TraceError  # noqa: E402

FAMILIES = ("nemotron_h", "qwen3_5", "mamba2", "qwen3_next")
VOCAB = 256


def _tiny_model(family: str) -> torch.nn.Module:
    """A tiny model of ``family`` with trained-like synthetic weights."""
    if family == "nemotron_h":
        return build_model("tiny-mamba2", layers=2, seed=1)
    if family == "qwen3_5":
        return build_model("tiny-gdn", layers=2, seed=2)
    if family == "mamba2":
        preset = Preset("test-mamba2", "mamba2", 4, 16, 16, 2, 2, "test")
        config = transformers.Mamba2Config(
            vocab_size=VOCAB, hidden_size=32, num_heads=4, head_dim=16, state_size=16,
            n_groups=2, num_hidden_layers=2, expand=2)
        model = transformers.Mamba2ForCausalLM(config)
    else:  # qwen3_next, with one MoE layer
        preset = Preset("test-next", "gdn", 4, 16, 16, 2, 2, "test")
        config = transformers.Qwen3NextConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
            layer_types=["linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            intermediate_size=64, mlp_only_layers=[1], num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=16)
        model = transformers.Qwen3NextForCausalLM(config)
    init_weights_(model, preset, seed=3)
    return model.eval()


def _save_tokenizer(path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab - 1)}
    words["[UNK]"] = vocab - 1
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.save_pretrained(str(path))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> checkpoint directory (the nemotron_h one has a tokenizer)."""
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        _tiny_model(family).save_pretrained(str(path))
        if family == "nemotron_h":
            _save_tokenizer(path, _tiny_vocab(path))
        out[family] = path
    return out


def _tiny_vocab(path) -> int:
    import json

    return json.loads((path / "config.json").read_text())["vocab_size"]


def _native_decode(model, ids, steps):
    """transformers' own greedy decode: the tokens fed and the logits of each step."""
    import inspect

    params = inspect.signature(model.forward).parameters
    kw = next(k for k in CACHE_KWARGS if k in params)
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=True, **{kw: cache}).logits[:, -1]
        tokens, out = [], []
        for _ in range(steps):
            tok = logits.argmax(-1)
            tokens.append(tok)
            logits = model(input_ids=tok[:, None], use_cache=True, **{kw: cache}).logits[:, -1]
            out.append(logits.float())
    return tokens, out


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_decode_matches_transformers_and_exact_designs(checkpoints, family):
    """Loaded offline from save_pretrained: the reference rows reproduce transformers'
    own decode, and fp32 designs (replay over a window) reproduce the reference."""
    hm = load_checkpoint(checkpoints[family], device="cpu")
    assert hm.weights == f"checkpoint {checkpoints[family].resolve()}"
    assert hm.architecture == {"nemotron_h": "NemotronHForCausalLM",
                               "qwen3_5": "Qwen3_5ForCausalLM", "mamba2": "Mamba2ForCausalLM",
                               "qwen3_next": "Qwen3NextForCausalLM"}[family]
    ids = torch.randint(0, hm.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    tokens, native = _native_decode(hm.model, ids, 10)
    designs = [make_design("shared", "fp32", 3), make_design("split", "fp32", 5)]
    with DesignDecode(hm, designs, batch=2, ring_dtype="fp32") as dd:
        dd.prefill(ids)
        for t in range(10):
            logits = dd.step(tokens[t])
            scale = native[t].std()
            assert (logits[:2] - native[t]).abs().max() < 1e-4 * scale
            for g in (1, 2):
                assert (logits[2 * g:2 * g + 2] - logits[:2]).abs().max() < 1e-4 * scale
    assert "forward" not in hm.mixers[hm.ssm_layers[0]].__dict__  # wrappers removed


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_design_rows_run_the_engine_runner(checkpoints, family):
    """The first SSM layer sees the same inputs in every row, so each design's output
    there must be exactly that of an independent TorchDesignRunner on the recorded
    inputs, seeded with the prefill state (checkpoint, read copy, ring, SR seeds)."""
    hm = load_checkpoint(checkpoints[family], device="cpu")
    first = hm.ssm_layers[0]
    designs = [make_design("split", "nvfp4", 4, "fp16-sr"), make_design("shared", "fp8-e4m3", 3),
               make_design("shared", "bf16-sr", 1)]
    ids = torch.randint(0, hm.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    seed, rdt = 5, ring_dtype_of("bf16")
    outputs = []
    with DesignDecode(hm, designs, batch=2, ring_dtype="bf16", seed=seed, record=[first]) as dd:
        token = dd.prefill(ids)[:2].argmax(-1)
        for _ in range(9):
            token = dd.step(token)[:2].argmax(-1)
            outputs.append(dd.outputs[first].clone())
        state0 = dd.layers[first].state0.float()
        raw_params = dd.layers[first].raw_params
    kind = kind_for(hm.layer_shape(first))
    params = kind.params({k: v.float() for k, v in raw_params.items()})
    runners = [TorchDesignRunner(d, kind, params, 2, torch.device("cpu"), rdt, seed + 2 * first,
                                 state0) for d in designs]
    groups = 1 + len(designs)
    for t, raw in enumerate(dd.recorded[first]):
        # every group's rows hold these inputs; prepare them at the same batch size as
        # the model does (vectorised elementwise kernels round tails differently)
        full = {k: v.repeat(groups, *[1] * (v.dim() - 1)) for k, v in raw.items() if k != "z"}
        inp = kind.prepare(full, params, rdt)
        for g, r in enumerate(runners, start=1):
            y, _ = r.step(rows(inp, slice(2 * g, 2 * g + 2)), t)
            assert torch.equal(y, outputs[t][2 * g:2 * g + 2]), (t, g)
    # lossy designs do perturb the model
    assert not torch.equal(outputs[-1][2:4], outputs[-1][:2])


def test_design_runners_are_built_after_the_kernels_compile(checkpoints, monkeypatch):
    """On the kernels, building a runner launches its initial state's encode: the runners
    are built at the first decode step, after the walk that compiles their kernels, not
    at prefill."""
    from precisionlab.kernels import backend as kb

    hm = load_checkpoint(checkpoints["nemotron_h"], device="cpu")
    events: list[str] = []
    monkeypatch.setattr(kb, "precompile_designs", lambda *a, **k: events.append("walk"))
    designs = [make_design("split", "fp8-e4m3", 2)]
    ids = torch.randint(0, hm.vocab_size, (1, 4), generator=torch.Generator().manual_seed(1))
    with DesignDecode(hm, designs, batch=1, backend="triton") as dd:
        dd.runner_factory = lambda *a: events.append("build") or TorchDesignRunner(*a)
        token = dd.prefill(ids)[:1].argmax(-1)
        assert events == []
        dd.step(token)
    assert events[0] == "walk" and events.count("walk") == 1
    assert events.count("build") == len(hm.ssm_layers) * len(designs)


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_5"])
def test_design_rows_run_on_the_kernels(checkpoints, family):
    """backend="triton": the designs' rows run on the fused kernels (CUDA, or the
    Triton interpreter on the CPU) and give the torch backend's outputs: the first SSM
    layer sees the same inputs under both, so its outputs differ only by the kernels'
    summation order (fp32) or, where that moves a stochastic rounding, a little more."""
    from precisionlab.kernels.testing import kernel_device

    dev = kernel_device()
    hm = load_checkpoint(checkpoints[family], device=dev)
    first = hm.ssm_layers[0]
    designs = [make_design("shared", "fp32", 3), make_design("split", "fp8-e4m3", 2),
               make_design("split", "nvfp4", 2, "fp16-sr")]
    ids = torch.randint(0, hm.vocab_size, (2, 5), generator=torch.Generator().manual_seed(4))
    runs = {}
    for backend in ("torch", "triton"):
        outs, errs = [], []
        with DesignDecode(hm, designs, batch=2, ring_dtype="bf16", seed=7,
                          backend=backend) as dd:
            token = dd.prefill(ids)[:2].argmax(-1)
            for _ in range(5):  # flushes at steps 2 (window 3) and 1, 3 (window 2)
                token = dd.step(token)[:2].argmax(-1)
                outs.append(dd.outputs[first].cpu().clone())
                errs.append(dd.ssm_out_err)
            kinds = {type(r).__name__ for r in dd.layers[first].runners}
        assert kinds == ({"TorchDesignRunner"} if backend == "torch" else
                         {"TritonMamba2Design" if family == "nemotron_h" else "TritonGDNDesign"})
        runs[backend] = torch.stack(outs), torch.stack(errs)
    (y_t, e_t), (y_k, e_k) = runs["torch"], runs["triton"]
    assert torch.equal(y_t[:, :2], y_k[:, :2])  # the reference rows: torch either way
    for g in range(1, 4):  # fp32 to 1e-5; a lossy copy's rounding may follow an ulp
        a, b = y_t[:, 2 * g:2 * g + 2], y_k[:, 2 * g:2 * g + 2]
        assert ((b - a).norm() / a.norm()).item() < (1e-5 if g == 1 else 1e-4), g
    assert (e_t[:, 1:] > 1e-4).all()  # the lossy designs' errors ...
    torch.testing.assert_close(e_k, e_t, rtol=1e-3, atol=1e-6)  # ... are the kernels' too
    with pytest.raises(ModelError, match="unknown backend"):
        DesignDecode(hm, designs, batch=2, backend="cuda")


def test_model_drift_backend_choice():
    """auto runs torch emulation on the CPU; triton there is a usage error."""
    from precisionlab.studies.model_drift import ModelStudyError, model_drift

    ds = model_drift("tiny-mamba2", "fp8-e4m3", designs="split", windows=2, steps=3, layers=1,
                     batch=1, device="cpu")
    assert ds.attrs["backend"] == "torch" and "backend='auto'" in ds.attrs["command"]
    assert "notes" not in ds.attrs
    from precisionlab.studies import StudyWarning

    with pytest.warns(StudyWarning, match="window 4 is longer than the 3 steps"):
        long = model_drift("tiny-mamba2", "fp8-e4m3", designs="split", windows=[2, 4], steps=3,
                           layers=1, batch=1, device="cpu")
    assert long.attrs["notes"].startswith("window 4 is longer")
    with pytest.raises(ModelStudyError, match="needs a CUDA device"):
        model_drift("tiny-mamba2", "fp8-e4m3", steps=2, layers=1, device="cpu", backend="triton")
    with pytest.raises(ModelStudyError, match="unknown backend"):
        model_drift("tiny-mamba2", "fp8-e4m3", steps=2, layers=1, backend="jax")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the triton backend needs a CUDA GPU")
@pytest.mark.parametrize("preset", ["tiny-mamba2", "tiny-gdn"])
def test_model_drift_is_the_same_on_both_backends(preset):
    from precisionlab.studies.model_drift import model_drift

    kw = dict(windows=(1, 4), steps=24, layers=2, batch=2, seed=2, device="cuda")
    a = model_drift(preset, ["fp32", "fp8-e4m3", "nvfp4"], backend="torch", **kw)
    b = model_drift(preset, ["fp32", "fp8-e4m3", "nvfp4"], backend="auto", **kw)
    assert a.attrs["backend"] == "torch" and b.attrs["backend"] == "triton"
    for v in ("rel_err", "ssm_out_rel_err"):
        np.testing.assert_allclose(b[v].values, a[v].values, rtol=5e-2, atol=5e-5)
    assert float(a["rel_err"].sel(format="nvfp4").max()) > 1e-3


def test_model_drift_on_a_preset(tmp_path):
    from precisionlab.export import load_result, save_result
    from precisionlab.gates import check
    from precisionlab.plots import save_plot
    from precisionlab.studies.model_drift import ModelStudyError, model_drift

    ticks = []
    # fp32 ring: GDN's ring of d values is then exact too, so fp32 designs are exact
    ds = model_drift("tiny-gdn", ["fp32", "nvfp4"], windows=(1, 4), steps=20, layers=2,
                     seed=3, ring_dtype="fp32", progress=lambda d, n: ticks.append(d))
    assert ticks[-1] == 20
    assert dict(ds.sizes) == {"design": 2, "format": 2, "window": 2, "step": 20}
    for v in ("rel_err", "rel_err_max", "kl", "top1_agree", "dlogp_mean", "dlogp_p95",
              "ssm_out_rel_err", "state_rel_err"):
        assert ds[v].dims == ("design", "format", "window", "step")
    for v in ("first_divergence", "kl_run_mean", "top1_run_rate", "dlogp_run_mean",
              "dlogp_run_p95", "growth", "final_sem", "bytes_per_step"):
        assert ds[v].dims == ("design", "format", "window")
    a = ds.attrs
    assert a["weights"] == "synthetic weights (preset config)"
    assert a["architecture"] == "Qwen3_5ForCausalLM" and a["ssm_layers"] == 2
    assert a["rel_err_of"] == "final logits" and a["kind"] == "gdn"
    assert "seeded token ids" in a["prompt"] and a["version_transformers"]
    exact = ds.sel(format="fp32")
    lossy = ds.sel(format="nvfp4", design="shared")
    assert float(exact["rel_err"].max()) < 1e-5 and float(exact["kl"].max()) < 1e-9
    assert bool((exact["top1_agree"] == 1).all())
    assert np.isnan(exact["first_divergence"]).all()
    assert float(lossy["kl"].mean()) > 1e-6 and float(lossy["rel_err"].mean()) > 1e-4
    # flush steps carry a state error (window 4: steps 3, 7, ...), others NaN
    st = ds["state_rel_err"].sel(design="split", format="nvfp4", window=4).values
    assert np.isfinite(st[3::4]).all() and np.isnan(st[0::4]).all()
    # gate, plot and export read it like a drift result
    assert len(check(ds, max_rel_err=1.0)) == 8
    exact_kl = check(ds, var="kl", max_value=1e-9, where={"format": ["fp32"]})
    assert len(exact_kl) == 4 and all(c.passed for c in exact_kl)
    assert not all(c.passed for c in check(ds, var="kl", max_value=1e-9))
    assert all(c.passed for c in check(ds, var="top1_agree", min_value=1.0,
                                       where={"format": ["fp32"]}))
    # the model-level traffic is the layer shapes' (qwen-like GDN: V x K state matrices)
    assert float(ds["bytes_per_step"].sel(design="shared", format="fp32", window=1)) == 8.0
    two = model_drift("tiny-gdn", "nvfp4", designs="split", windows=4, steps=4, layers=1,
                      checkpoint_format=["fp32", "fp16-sr"])
    assert two["design"].values.tolist() == ["split-fp32", "split-fp16-sr"]
    assert np.isfinite(two["rel_err"]).all() and two.attrs["checkpoint_format"] == "fp32,fp16-sr"
    cost = two["bytes_per_step"].sel(format="nvfp4", window=4)
    assert float(cost.sel(design="split-fp16-sr")) < float(cost.sel(design="split-fp32"))
    save_plot(ds, tmp_path / "c.png")
    save_plot(ds, tmp_path / "w.png", "window")
    for kind, metric in (("curves", "kl"), ("window", "top1_agree"), ("tradeoff", "top1_agree"),
                         ("tradeoff", "dlogp_p95")):
        png = save_plot(ds, tmp_path / f"{kind}-{metric}.png", kind, metric)
        assert png.read_bytes()[:4] == b"\x89PNG"
    save_result(ds, tmp_path / "r.nc")
    back = load_result(tmp_path / "r.nc")
    assert np.allclose(back["kl"].values, ds["kl"].values, equal_nan=True)
    with pytest.raises(ModelStudyError, match="no tokenizer"):
        model_drift("tiny-gdn", "nvfp4", steps=2, layers=1, prompt=tmp_path / "c.png")
    with pytest.raises(StudyError, match="unknown model"):
        model_drift("no-such-model", "nvfp4", steps=2)
    with pytest.raises(ModelError, match="steps must be positive"):
        model_drift("tiny-gdn", "nvfp4", steps=0)
    with pytest.raises(StudyError, match="unknown"):
        model_drift("tiny-gdn", "nvfp5", steps=2, layers=1)


def test_model_drift_on_a_checkpoint_with_a_text_prompt(checkpoints, tmp_path):
    from precisionlab.studies.model_drift import model_drift

    text = tmp_path / "prompt.txt"
    text.write_text(" ".join(f"w{(7 * i) % 50}" for i in range(40)))
    path = checkpoints["nemotron_h"]
    ds = model_drift(path, "fp8-e4m3", designs="split", windows=4, steps=6, batch=2,
                     prompt=text, prompt_tokens=16, dtype="bf16", device="cpu")
    assert ds.attrs["weights"] == f"checkpoint {path.resolve()}"
    assert ds.attrs["prompt"].startswith("text file") and ds.attrs["prompt_tokens"] == 16
    assert ds.attrs["model_dtype"] == "bf16"
    assert np.isfinite(ds["kl"].values).all()
    with pytest.raises(ModelError, match="prompt file not found"):
        model_drift(path, "fp8-e4m3", steps=2, prompt=tmp_path / "missing.txt")
    short = tmp_path / "short.txt"
    short.write_text("w1")
    with pytest.raises(ModelError, match="fewer than batch"):
        model_drift(path, "fp8-e4m3", steps=2, batch=2, prompt=short)
    with pytest.raises(ModelError, match="no tokenizer"):
        model_drift(checkpoints["qwen3_5"], "fp8-e4m3", steps=2, prompt=text)


def test_capture_trace_writes_replayable_layer_traces(checkpoints, tmp_path):
    from precisionlab.studies import drift

    hm = load_checkpoint(checkpoints["nemotron_h"], device="cpu")
    paths = capture_trace(hm, None, 12, tmp_path / "t.safetensors", batch=2, seed=4)
    assert [p.name for p in paths] == [f"t.L{i}.safetensors" for i in hm.ssm_layers]
    trace = SavedTrace(paths[0])
    shape = hm.layer_shape(hm.ssm_layers[0])
    assert trace.steps == 12 and trace.batch == 2 and trace.kind == "mamba2"
    assert trace.preset.state_shape == shape.state_shape and trace.preset.groups == shape.groups
    assert trace.preset.name == f"{hm.name}.L{hm.ssm_layers[0]}"
    assert set(trace.data) == {"x", "dt_raw", "B", "C", "z"} and trace.state0 is not None
    assert "captured from checkpoint" in trace.source
    mixer = hm.mixers[hm.ssm_layers[0]]
    assert torch.allclose(trace.params["A"].float(), -torch.exp(mixer.A_log.float()))
    # the engine replays it; fp32 state with fp32 ring is exact
    ds = drift(str(paths[1]), ["fp32", "nvfp4"], windows=(4,), designs="split", ring_dtype="fp32",
               backend="torch", device="cpu")
    assert float(ds["rel_err"].sel(format="fp32").max()) < 1e-5
    assert float(ds["rel_err"].sel(format="nvfp4").mean()) > 1e-4
    # a GDN layer, one chosen layer, from a preset
    (only,) = capture_trace("tiny-gdn", None, 5, tmp_path / "g.safetensors", layers=[1],
                            model_layers=2)
    assert only.name == "g.L1.safetensors"
    g = SavedTrace(only)
    assert g.kind == "gdn" and set(g.data) == {"q", "k", "v", "a", "b"}
    with pytest.raises(CaptureError, match="not an SSM layer"):
        capture_trace(hm, None, 2, tmp_path / "x.safetensors", layers=[1])
    with pytest.raises(TraceError, match="end in .safetensors"):
        capture_trace(hm, None, 2, tmp_path / "x.pt")
    with pytest.raises(ModelError, match="missing' does not exist"):
        capture_trace(hm, None, 2, tmp_path / "missing" / "x.safetensors")


def test_layers_truncate_a_checkpoint(checkpoints):
    hm = load_checkpoint(checkpoints["qwen3_next"], layers=1, device="cpu")
    assert hm.ssm_layers == [0] and hm.num_layers == 1
    assert hm.weights.endswith("(first 1 SSM layers)")
    hm = load_checkpoint(checkpoints["nemotron_h"], layers=1, device="cpu")
    assert hm.ssm_layers == [0] and hm.config.layers_block_type == ["linear_attention", "mlp"]
    with pytest.raises(ModelError, match="fewer than layers=5"):
        load_checkpoint(checkpoints["mamba2"], layers=5)


def test_bad_models(tmp_path, checkpoints):
    with pytest.raises(ModelError, match="checkpoint directory not found"):
        open_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        open_model(tmp_path / "empty")
    llama = tmp_path / "llama"
    transformers.LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32,
                             architectures=["LlamaForCausalLM"]).save_pretrained(llama)
    with pytest.raises(ModelError, match="unsupported architecture LlamaForCausalLM"):
        open_model(llama)
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        open_model("nope")
    with pytest.raises(ModelError, match="unknown model dtype"):
        open_model(checkpoints["mamba2"], dtype="fp8")
    with pytest.raises(ModelError, match="positive number of SSM layers"):
        synthetic_model("tiny-gdn", layers=0)
    for exc in (ModelError("x"),):
        assert isinstance(exc, ValueError) and "\n" not in str(exc)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_configs_carry_the_ssm_shapes(name):
    preset = PRESETS[name]
    config = build_config(name, layers=4)
    text = config.get_text_config()
    types = list(getattr(text, "layers_block_type", None) or text.layer_types)
    assert types.count("linear_attention") == 4
    if name.startswith("mamba2-"):
        assert (text.num_heads, text.head_dim, text.state_size, text.n_groups) == (
            preset.heads, preset.head_dim, preset.state_dim, preset.groups)
        return
    assert types.count("full_attention") >= 1
    if preset.kind == "mamba2":
        assert (text.mamba_num_heads, text.mamba_head_dim, text.ssm_state_size,
                text.n_groups) == (preset.heads, preset.head_dim, preset.state_dim, preset.groups)
    else:
        assert (text.linear_num_value_heads, text.linear_value_head_dim,
                text.linear_key_head_dim, text.linear_num_key_heads) == (
            preset.heads, preset.head_dim, preset.state_dim, preset.groups)
    assert text.hidden_size == ARCHITECTURES[name].hidden
    full = build_config(name)
    full_types = list(getattr(full, "layers_block_type", None) or full.layer_types)
    assert full_types.count("linear_attention") == preset.ssm_layers


def test_synthetic_weights_are_trained_like_and_seeded():
    hm = synthetic_model("tiny-mamba2", layers=3, seed=7, device="cpu")
    rates = torch.cat([torch.exp(m.A_log.detach().double()) for m in hm.mixers.values()])
    assert rates.min() >= 1e-3 * (1 - 1e-6) and rates.max() <= 1e4 * (1 + 1e-6)
    assert math.log10(float(rates.max() / rates.min())) > 3  # spread over decades
    again = synthetic_model("tiny-mamba2", layers=3, seed=7, device="cpu")
    for p, q in zip(hm.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert layer_plan(4, 1) == ["ssm"] * 4 + ["attn"]
    assert layer_plan(6, 2) == ["ssm"] * 3 + ["attn"] + ["ssm"] * 3 + ["attn"]


def test_engine_replay_of_a_captured_gdn_trace_matches_the_model(tmp_path):
    """A captured trace, replayed by the engine's fp64 reference from ``state0``,
    reproduces the model layer's own SSM outputs (the capture is faithful)."""
    hm = synthetic_model("tiny-gdn", layers=2, seed=5, device="cpu")
    first = hm.ssm_layers[0]
    ids, _ = prompt_ids(hm, None, batch=2, prompt_tokens=4, seed=0)
    outs = []
    with DesignDecode(hm, [], batch=2, ring_dtype="fp32", record=[first]) as dd:
        token = dd.prefill(ids).argmax(-1)
        for _ in range(6):
            token = dd.step(token).argmax(-1)
            outs.append(dd.outputs[first].clone())
    (path,) = capture_trace(hm, None, 6, tmp_path / "c.safetensors", layers=[first], batch=2,
                            seed=0, prompt_tokens=4)
    trace = SavedTrace(path)
    kind = kind_for(trace.preset)
    params = kind.params({k: v.double() for k, v in trace.params.items()})
    S = trace.state0.clone()
    for t, raw in enumerate(trace):
        inp = kind.prepare(raw, kind.params({k: v.float() for k, v in trace.params.items()}),
                           torch.float32)
        y = kind.reference_step_(S, inp.to(torch.float64), params)
        assert torch.allclose(y.float(), outs[t], atol=1e-6), t
    assert engine.resolve_device("cpu").type == "cpu"


def test_multimodal_qwen35_checkpoint_loads_its_text_model(tmp_path):
    """Qwen3.5 checkpoints ship as Qwen3_5ForConditionalGeneration; the text model
    (with every weight) is what model-level studies load."""
    from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  patch_size=4, temporal_patch_size=1, spatial_merge_size=1)
    config = Qwen3_5Config(text_config=build_config("tiny-gdn", layers=2).to_dict(),
                           vision_config=vision, architectures=["Qwen3_5ForConditionalGeneration"])
    full = Qwen3_5ForConditionalGeneration(config).eval()
    full.save_pretrained(str(tmp_path))
    hm = load_checkpoint(tmp_path, device="cpu")
    assert hm.architecture == "Qwen3_5ForCausalLM" and hm.ssm_layers == [0, 1]
    originals = [p for p in full.parameters()]
    for name, p in hm.model.named_parameters():
        assert any(q.shape == p.shape and torch.equal(q, p) for q in originals), name
