"""Write the JSON reports of 16 reference runs and the output of 16 command lines, to check that a
refactoring changes no number and no rendered byte.

    python scripts/reference_reports.py OUT_DIR          # one file per run
    diff -r BEFORE_DIR AFTER_DIR                          # byte-identical when nothing changed

The runs cover torchvision (real, shape-only, meta, backward), transformers (BERT, GPT-2, Llama;
real, meta, backward), module rules (class, path, nested, shared module), a user training loop
under a Counter, and a custom operator without a rule. The command lines cover every output
format and what the features add to a report: roofline estimates, peak memory (forward and a
training step), a tensor-parallel rank, a pipeline, generation steps, symbolic formulas.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flopscope


def _tv(name: str, meta: bool = False) -> nn.Module:
    import torchvision

    if meta:
        with torch.device("meta"):
            return torchvision.models.get_model(name, weights=None)  # type: ignore[no-any-return]
    return torchvision.models.get_model(name, weights=None)  # type: ignore[no-any-return]


def _hf(name: str, meta: bool = False) -> nn.Module:
    import transformers

    kw: dict[str, Any]
    if name == "gpt2":
        kw = dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    else:
        kw = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
        if name == "llama":
            kw["num_key_value_heads"] = 2
    config = transformers.AutoConfig.for_model(name, **kw)
    config._attn_implementation = "sdpa"
    cls = transformers.AutoModelForMaskedLM if name == "bert" else transformers.AutoModelForCausalLM
    if meta:
        with torch.device("meta"):
            return cls.from_config(config)  # type: ignore[no-any-return]
    return cls.from_config(config)  # type: ignore[no-any-return]


def _img(n: int = 1, size: int = 64) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


def _ids() -> torch.Tensor:
    return torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.proj = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.proj(a @ v)


class _Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attention()
        self.shared = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.shared(self.attn(x))) + x


def _training_loop() -> flopscope.Report:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with flopscope.Counter(model) as c:
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return c.report


def _custom_op() -> flopscope.Report:
    lib = torch.library.Library("flopscope_ref", "FRAGMENT")  # noqa: TID251
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    model = nn.Sequential(nn.Linear(8, 8))
    x = torch.randn(4, 8)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return torch.ops.flopscope_ref.twice(self.inner(t))  # type: ignore[no-any-return]

    return flopscope.count(M(), x, warn=False)


def runs() -> dict[str, Callable[[], flopscope.Report]]:
    torch.manual_seed(0)
    return {
        "resnet18_real": lambda: flopscope.count(_tv("resnet18"), _img()),
        "resnet50_shape_only": lambda: flopscope.count(_tv("resnet50"), _img(), shape_only=True),
        "resnet18_backward": lambda: flopscope.count(_tv("resnet18"), _img(2), backward=True,
                                                     train=True),
        "vit_b_16_meta": lambda: flopscope.count(_tv("vit_b_16", meta=True), _img(1, 224)),
        "swin_t_meta_backward": lambda: flopscope.count(_tv("swin_t", meta=True), _img(1, 224),
                                                        backward=True, train=True),
        "mobilenet_v3_small_no_grad": lambda: _no_grad(_tv("mobilenet_v3_small"), _img()),
        "convnext_tiny_shape_only_bwd": lambda: flopscope.count(
            _tv("convnext_tiny"), _img(), shape_only=True, backward=True),
        "bert_real": lambda: flopscope.count(_hf("bert"), _ids()),
        "gpt2_meta_backward": lambda: flopscope.count(_hf("gpt2", meta=True), _ids(),
                                                      backward=True, train=True),
        "llama_real_backward": lambda: flopscope.count(_hf("llama"), _ids(), backward=True),
        "llama_meta": lambda: flopscope.count(_hf("llama", meta=True), _ids()),
        "mha_module": lambda: flopscope.count(nn.MultiheadAttention(64, 4), *([torch.randn(5, 2, 64)] * 3)),
        "rule_on_class_and_shared": lambda: flopscope.count(
            _Wrapper(), torch.randn(2, 10, 64), rules={_Attention: lambda m, a, o: 1234}),
        "rule_on_path_backward": lambda: flopscope.count(
            _Wrapper(), torch.randn(2, 10, 64), rules={"attn.qkv": lambda m, a, o: flopscope.Cost(
                macs=7, flops=20, bytes_read=3, bytes_written=4)}, backward=True),
        "training_loop": _training_loop,
        "custom_op_uncounted": _custom_op,
    }


def _no_grad(model: nn.Module, x: torch.Tensor) -> flopscope.Report:
    with torch.no_grad():
        return flopscope.count(model.eval(), x)


_TINY = ["--config=num_hidden_layers=2", "--config=hidden_size=64", "--config=intermediate_size=128",
         "--config=num_attention_heads=4", "--config=num_key_value_heads=2",
         "--config=vocab_size=128"]
_R18 = ["count", "torchvision:resnet18", "--input", "1x3x64x64"]
COMMANDS: dict[str, list[str]] = {
    "cli_table": _R18,
    "cli_table_ops_depth3": [*_R18, "--by", "op", "--depth", "3"],
    "cli_markdown": [*_R18, "--format", "markdown"],
    "cli_csv": [*_R18, "--format", "csv"],
    "cli_csv_ops": [*_R18, "--format", "csv", "--by", "op"],
    "cli_roofline_memory": [*_R18, "--hardware", "h100-sxm", "--memory"],
    "cli_roofline_memory_json": [*_R18, "--hardware", "h100-sxm", "--memory", "--format", "json"],
    "cli_roofline_markdown": [*_R18, "--hardware", "a100-80gb", "--tf32", "--format", "markdown"],
    "cli_training_step_memory": ["count", "torchvision:resnet18", "--input", "2x3x64x64",
                                 "--backward", "--memory", "--format", "json"],
    "cli_mfu": [*_R18, "--hardware", "h100-sxm", "--step-time", "0.001"],
    "cli_tp_rank": ["count", "hf:llama", "--shape-only", "--seq-len", "16", *_TINY,
                    "--world-size", "4", "--tp", "2", "--fsdp", "2"],
    "cli_tp_rank_json": ["count", "hf:llama", "--shape-only", "--seq-len", "16", *_TINY,
                         "--world-size", "2", "--tp", "2", "--format", "json"],
    "cli_pipeline": ["count", "hf:llama", "--shape-only", "--seq-len", "16", *_TINY,
                     "--batch", "2", "--world-size", "2", "--pp", "2", "--microbatches", "2"],
    "cli_generate": ["generate", "hf:llama", "--shape-only", "--prompt-len", "8",
                     "--new-tokens", "3", *_TINY],
    "cli_generate_json": ["generate", "hf:llama", "--shape-only", "--prompt-len", "8",
                          "--new-tokens", "3", *_TINY, "--format", "json"],
    "cli_symbolic": ["count", "hf:gpt2", "--symbolic", "batch,seq_len", "--config=n_layer=2",
                     "--config=n_embd=32", "--config=n_head=4", "--config=vocab_size=100"],
}


def _command(argv: list[str]) -> str:
    """What the command line prints (stdout) for ``argv``, exit status first."""
    import contextlib
    import io

    from flopscope.cli import main as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = cli(argv)
    return f"exit {status}\n{out.getvalue()}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    for name, fn in runs().items():
        torch.manual_seed(0)
        report = fn()
        (out / f"{name}.json").write_text(report.to_json() + "\n")
        print(f"{name}: {report.macs} MACs, {report.flops} FLOPs")
    for name, args in COMMANDS.items():
        torch.manual_seed(0)
        text = _command(args)
        (out / f"{name}.txt").write_text(text)
        print(f"{name}: {text.splitlines()[0]}, {len(text)} characters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
