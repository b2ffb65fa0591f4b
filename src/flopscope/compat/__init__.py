"""Drop-in replacements for other tools' entry points, with flopscope's counting semantics.

- :mod:`flopscope.compat.thop`: ``profile()`` and ``clever_format()`` of thop (pytorch-OpCounter).
"""
