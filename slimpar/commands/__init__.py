"""The commands behind the CLI: ``slimpar train`` (``train``: validate once, launch, report a stop in one line),
``slimpar eval`` (``evaluate``, ``lm_eval``), ``slimpar export --hf`` (``export_hf``), ``slimpar sample``
(``sample``) and ``slimpar plan`` (``plan``, ``plan_memory``, ``plan_fit``). They read a run folder or a config;
the trainer never imports them."""

__all__ = ["evaluate", "export_hf", "lm_eval", "plan", "plan_fit", "plan_memory", "sample", "train"]
