"""The engine: sees every operator call through a dispatch mode, attributes it to the module that
made it, costs it with its rule and adds it up; knows nothing about how the model is run or how a
report is shown.

``counter`` (the :class:`~flopscope.core.counter.Counter` and its dispatch mode), ``tracker``
(which module is running, in which phase), ``params`` (the model's parameter table), ``memo``
(the shape-only fast path), ``replay`` (a symbolic count's whole-module replay), ``decompose``
(operators without a rule), ``numbers`` (integer and complex work), ``dtensor``, ``comm``
(collectives), ``integrity`` (copy on write of the model's tensors), ``settings`` (the torch
setting changed while counting).
"""
