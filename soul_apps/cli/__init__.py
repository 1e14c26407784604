"""The ``soul`` command: argument parsing (``main``), rendering (``render``), the demo and its scenario,
and the ``soul bench`` sub-commands (``bench``).

May import everything: ``actors`` (through ``soul_runtime.connect``), ``bench``, ``loop``, ``memory``, ``models``.
Nothing imports ``cli``.
"""
