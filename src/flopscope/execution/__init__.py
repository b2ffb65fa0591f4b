"""How a model is run for a count: on meta copies, fake tensors or for real, and how it is left
as it was. ``meta``: meta-device models and SDPA's kernel choice replayed on meta.
"""
