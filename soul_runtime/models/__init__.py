"""Language models: the ``LanguageModel`` protocol, the Anthropic adapter, the offline rule-based model and
the choice between them (``choice.make_model``).

May import: the foundation modules only. Never ``memory``, ``loop``, ``cli``, ``bench``, ``actors`` or ``ray``.
"""
