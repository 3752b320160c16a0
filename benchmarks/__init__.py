"""``slimpar bench``: the benchmarks behind docs/results (``sdp``, ``mapl``, ``memory``, ``modes``, ``quality``,
``network``, ``group_scale``, ``plan_sim``, ``gpu``), their runner, timing and reports, and the generated
blocks of the results pages (``readme``)."""

__all__ = ["cli", "gpu", "gpu_check", "group_scale", "mapl", "memory", "modes", "network", "plan_sim", "plots",
           "quality", "readme", "readme_render", "readme_tables", "report", "runner", "sdp", "timing"]
