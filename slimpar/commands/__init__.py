"""Commands that are not training: ``slimpar eval`` (``evaluate``, ``lm_eval``), ``slimpar export --hf``
(``export_hf``), ``slimpar sample`` (``sample``) and ``slimpar plan`` (``plan``, ``plan_memory``). They read a run
folder or a config; the trainer never imports them."""

__all__ = ["evaluate", "export_hf", "lm_eval", "plan", "plan_memory", "sample"]
