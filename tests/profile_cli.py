"""What the `probe profile` tests share: the command runner, a tiny model shape, fast
settings, the op names of the decode graphs."""

import json

from typer.testing import CliRunner

from sdpa_probe.cli import app

cli = CliRunner()
TINY = ["--custom", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--ffn", "96", "--vocab", "200"]
FAST = ["--steps", "3", "--warmup", "1", "--threads", "1", "--no-roofline", "--no-allocs"]
DECOMPOSED_OPS = {"kv_read_cast", "rope_window", "gqa_broadcast", "pack_k", "qk_matmul",
                  "softmax", "pv_matmul", "rope_q"}
COMMON_OPS = {"embed", "attn_norm", "q_proj", "k_proj", "v_proj", "kv_write", "o_proj",
              "attn_residual", "ffn_norm", "gate_proj", "up_proj", "silu_gate", "down_proj",
              "ffn_residual", "final_norm", "lm_head", "argmax"}


def run(*args):
    return cli.invoke(app, ["profile", *args])


def json_run(*args):
    res = run(*TINY, *FAST, "--json", "-", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)
