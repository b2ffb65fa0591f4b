"""``flopscope count --world-size N --pp/--ep/--sequence-parallel/--loss-parallel``: the options reach the layout,
the output carries every pipeline stage, and bad combinations are usage errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from flopscope.cli import main

# a 2-layer Llama small enough for the command line: hidden 64, 4 heads, vocab 256
LLAMA = ["hf:llama", "--config", "hidden_size=64", "--config", "intermediate_size=128",
         "--config", "num_hidden_layers=2", "--config", "num_attention_heads=4",
         "--config", "num_key_value_heads=2", "--config", "vocab_size=256", "--seq-len", "16"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pipeline_json_has_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "count", *LLAMA, "--shape-only", "--batch", "2", "--backward",
                        "--world-size", "2", "--pp", "2", "--schedule", "gpipe", "--rank", "1",
                        "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert (data["rank"], data["world_size"]) == (1, 2)
    pipe = data["pipeline"]
    assert (pipe["schedule"], pipe["microbatches"]) == ("gpipe", 2)
    assert [s["rank"] for s in pipe["stages"]] == [0, 1]
    # one microbatch of 1 x 16 tokens x 64 float32 = 4,096 bytes each way
    assert pipe["stages"][0]["p2p_bytes_per_microbatch"]["send_forward"] == 4096
    assert pipe["stages"][1]["p2p_bytes_per_microbatch"]["send_backward"] == 4096
    assert data["totals"]["flops"] == pipe["stages"][1]["flops"]  # the table is --rank's stage


def test_pipeline_table_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "count", *LLAMA, "--shape-only", "--batch", "2",
                        "--world-size", "2", "--pp", "2", "--microbatches", "2")
    assert code == 0
    assert "pipeline: 2 stages, 1f1b, 2 microbatches; bubble" in out
    assert "stage 1 (rank 1)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--pp", "2"], "--pp, --ep, --sequence-parallel, --loss-parallel and --microbatches need "
                    "--world-size"),
    (["--loss-parallel"], "--loss-parallel and --microbatches need --world-size"),
    (["--world-size", "2", "--loss-parallel"],
     "loss parallelism shards the logits over the tensor-parallel ranks: it needs --tp >= 2"),
    (["--world-size", "4", "--tp", "2", "--ep", "4", "--loss-parallel"],
     "is not built with --ep"),
    (["--world-size", "2", "--pp", "2", "--sequence-parallel", "--tp", "1"],
     "sequence parallelism shards activations over the tensor-parallel ranks"),
    (["--world-size", "4", "--ep", "2"], "expert parallelism is built over the whole world"),
    (["--world-size", "2", "--pp", "3"], "world size 2 is not a multiple of tp x pp"),
])
def test_bad_parallel_options(capsys: pytest.CaptureFixture[str], argv: list[str],
                              message: str) -> None:
    code, _, err = _run(capsys, "count", *LLAMA, "--shape-only", *argv)
    assert code == 2
    assert message in err


def test_loss_parallel_shards_the_head_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # TP 2 of the 2-layer Llama, 16 tokens, float32: the same rank without and with
    # --loss-parallel (Layout(loss_parallel=True), the planner's option)
    argv = ["count", *LLAMA, "--shape-only", "--backward", "--world-size", "2", "--tp", "2",
            "--format", "json"]
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    off = json.loads(out)
    code, out, _ = _run(capsys, *argv, "--loss-parallel")
    assert code == 0
    on = json.loads(out)
    assert off["loss_parallel"] == {"on": False, "loss": "sum"}
    assert on["loss_parallel"] == {"on": True, "loss": "cross_entropy"}
    # the head's products (forward, input gradient, weight gradient) on half the vocabulary:
    # 3 x 16 tokens x 64 x 256 / 2 = 393,216 MACs fewer on the rank
    assert off["totals"]["macs"] - on["totals"]["macs"] == 3 * 16 * 64 * 256 // 2
    # the loss's three all-reduces of one float32 per token (3 x 64 bytes) and the head's input
    # gradient all-reduced in backward (16 x 64 float32 = 4,096 bytes), beside the layers' 14
    kinds_off = off["communication"]["kinds"]["all_reduce"]
    kinds_on = on["communication"]["kinds"]["all_reduce"]
    assert (kinds_off["calls"], kinds_on["calls"]) == (14, 18)
    assert kinds_on["payload_bytes"] - kinds_off["payload_bytes"] == 3 * 16 * 4 + 16 * 64 * 4
    assert {r["group"] for r in on["communication"]["records"]} == {"tp"}


def test_loss_parallel_logical_figure_runs_the_same_loss(
        capsys: pytest.CaptureFixture[str]) -> None:
    """With --loss-parallel --backward the rank runs the causal LM's cross-entropy; its logical
    (unsharded) figure now runs it too, on the whole logits (16 tokens x 256 = 4,096 float32):
    log_softmax 5 FLOPs a logit (20,480), its backward 4 (16,384), nll_loss a negate and the
    mean's sum per token (2 x 16 = 32), its backward 1 per token (16): 36,912 FLOPs more than
    the logical figure backward from the sum of the outputs (0 FLOPs: a ones_like), the same
    MACs."""
    argv = ["count", *LLAMA, "--shape-only", "--backward", "--world-size", "2", "--tp", "2",
            "--format", "json"]
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    off = json.loads(out)["logical"]["totals"]
    code, out, _ = _run(capsys, *argv, "--loss-parallel")
    assert code == 0
    on = json.loads(out)
    assert on["loss_parallel"] == {"on": True, "loss": "cross_entropy"}
    logical = on["logical"]
    assert logical["totals"]["flops"] - off["flops"] == 20_480 + 16_384 + 32 + 16
    assert logical["totals"]["macs"] == off["macs"]
    losses = {r["op"]: r["flops"] for r in logical["records"] if r["module"] == ""
              and r["flops"]}
    assert losses == {"aten._log_softmax.default": 20_480,
                      "aten._log_softmax_backward_data.default": 16_384,
                      "aten.nll_loss_forward.default": 32,
                      "aten.nll_loss_backward.default": 16}


def test_loss_parallel_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "count", *LLAMA, "--shape-only", "--world-size", "2", "--tp", "2",
                        "--loss-parallel", "--depth", "0")
    assert code == 0
    assert ("loss parallelism: on: lm_head column-wise over the vocabulary, its logits "
            "vocabulary shards on each of the 2 tensor-parallel ranks; backward from no loss "
            "(forward only)") in out
