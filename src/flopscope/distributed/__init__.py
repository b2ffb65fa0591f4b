"""Sharded models: per-rank compute and communication under ``torch.distributed``.

See ``docs/distributed.md``.
"""
