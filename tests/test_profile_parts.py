"""The parts of `probe profile` under the command: the decode graphs' agreement and step
records, the model presets, the statistics, the --context grammar."""

import numpy as np
import pytest

from sdpa_probe.profile import decode, models, stats
from sdpa_probe.profile.attention import resolve_attention
from sdpa_probe.profile.measure import CHECK_TOL
from sdpa_probe.profile.settings import parse_contexts


@pytest.mark.parametrize("cache", ["f32", "f16", "i8"])
@pytest.mark.parametrize("weights", ["f32", "f16"])
def test_decomposed_and_fused_agree(cache, weights):
    shape = models.ModelShape("t", 2, 64, 6, 2, 16, 96, 150)
    model = decode.DecodeModel(shape, weights, seed=3, threads=1)
    fused = resolve_attention("fused", cache)
    states = [decode.DecodeState(model, decode.GRAPH_DECOMPOSED, -1, cache, 64, 1),
              decode.DecodeState(model, fused.graph, fused.kernel_index, cache, 64, 1)]
    for st in states:
        st.fill_history(0, 64, 11)
    outs = []
    for st in states:
        tok = 5
        for pos in (40, 41, 42):  # a few greedy steps: each graph extends its own cache
            st.step(tok, pos, timed=False, logits=True)
            tok = 7
        outs.append(st.last_logits.copy())
    rms = np.sqrt(np.mean(outs[1].astype(np.float64) ** 2))
    assert np.isfinite(outs[0]).all() and rms > 0
    assert np.max(np.abs(outs[0] - outs[1])) / rms < CHECK_TOL[cache]
    # same seed, same model: a second step reproduces the logits exactly
    st = states[1]
    st.fill_history(40, 43, 11)
    for pos in (40, 41, 42):
        st.step(5 if pos == 40 else 7, pos, timed=False, logits=True)
    np.testing.assert_array_equal(st.last_logits, outs[1])
    for st in states:
        st.close()
    model.close()


def test_step_records_cover_the_step():
    shape = models.ModelShape("t", 3, 32, 4, 1, 8, 64, 50)
    model = decode.DecodeModel(shape, "f32", threads=1)
    st = decode.DecodeState(model, decode.GRAPH_DECOMPOSED, -1, "f16", 16, 1)
    assert len(st.ops) == 1 + 3 * 21 + 3
    assert [o.layer for o in st.ops[:2]] == [-1, 0] and st.ops[-1].name == "argmax"
    wall, native_ns, rec, nxt = st.step(1, 5)
    assert rec.shape == (len(st.ops), 4) and 0 <= nxt < 50
    starts, durs = rec[:, 0], rec[:, 1]
    assert (durs >= 0).all() and (np.diff(starts) >= 0).all()
    assert durs.sum() <= native_ns <= wall
    st.close()
    model.close()


def test_presets_match_the_published_models():
    p = models.PRESETS
    assert (p["smollm2-135m"].layers, p["smollm2-135m"].hidden, p["smollm2-135m"].heads,
            p["smollm2-135m"].kv_heads, p["smollm2-135m"].head_dim,
            p["smollm2-135m"].ffn) == (30, 576, 9, 3, 64, 1536)
    q = p["qwen2.5-0.5b"]
    assert (q.layers, q.hidden, q.heads, q.kv_heads, q.head_dim, q.ffn) == (24, 896, 14, 2, 64,
                                                                             4864)
    ll = p["llama-3.2-1b"]
    assert (ll.layers, ll.hidden, ll.heads, ll.kv_heads, ll.head_dim, ll.ffn) == (16, 2048, 32, 8,
                                                                                64, 8192)
    assert "openelm-270m" in p
    assert 1.0e9 < ll.params() < 1.5e9  # ~1.24B with the tied 128k-vocab head


def test_stats_verdicts():
    rng = np.random.default_rng(0)
    a = 2.0 + 0.01 * rng.standard_normal(30)
    b = 1.0 + 0.01 * rng.standard_normal(30)
    ratio, lo, hi = stats.bootstrap_ratio_ci(a, b)
    assert lo <= ratio <= hi and stats.verdict(lo, hi) == "faster"
    ratio, lo, hi = stats.bootstrap_ratio_ci(b, a)
    assert stats.verdict(lo, hi) == "slower"
    ratio, lo, hi = stats.bootstrap_ratio_ci(a, a[::-1].copy())
    assert stats.verdict(lo, hi) == "no significant difference"
    assert stats.slope_per_1000([100, 1000, 2000], [1.0, 10.0, 20.0]) == pytest.approx(10.0)


def test_context_lists_and_ranges():
    p = parse_contexts
    assert p("100,1000,2000") == (100, 1000, 2000)
    assert p("500:4000:500") == (500, 1000, 1500, 2000, 2500, 3000, 3500, 4000)  # stop included
    assert p("0:10:3") == (0, 3, 6, 9)  # stop only when on the grid
    assert p("2000, 100:300:100,100") == (100, 200, 300, 2000)  # mixed, sorted, deduplicated
    assert p("1_000") == (1000,)
