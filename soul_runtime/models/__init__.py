"""Language models: the ``LanguageModel`` protocol (and ``AsyncLanguageModel``), the Anthropic and
OpenAI-compatible adapters, the offline rule-based model, and the choice between them or a user's own
(``choice.make_model``).

May import: the foundation modules only. Never ``memory``, ``loop``, ``cli``, ``bench``, ``actors`` or ``ray``.
"""
