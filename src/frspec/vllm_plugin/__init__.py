"""FR-Spec inside vLLM (placeholder while the plugin is written)."""


def register() -> None:
    pass
